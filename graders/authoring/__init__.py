"""What a kata's author runs: `kata lint` (content checked like code) and the mutation score."""
