"""The `kata` command: practise attention katas and have them graded.

Thin on purpose: parse the command line, call the judge (graders/engine) or a feature built on it
(graders/practice, graders/classroom, graders/authoring), render what comes back.
"""
from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from graders.classroom import release, rules
from graders.engine import manifest
from graders.engine.bundle import NO_REFERENCE, bundle_info
from graders.engine.manifest import ROOT, Kata, ManifestError
from graders.engine.report import bar, render, replay
from graders.engine.runner import (DEVICES, RunnerError, grade, needs_installing, new_seed, resolve_device,
                                   zygote_for)
from graders.practice import hints, repro
from graders.practice.history import Suggestion, progress, suggestions
from graders.practice.interview import Interview, render_scorecard
from graders.practice.interview import plan as interview_plan
from graders.practice.notebook import grade_notebook, notebook, solution_source
from graders.practice.workspace import Workspace


class EnvironmentProblem(click.ClickException):
    """The kit cannot run here as asked (a broken manifest, no CUDA): exit code 2."""

    exit_code = 2


workspace_option = click.option(
    "--workspace", "-w", type=click.Path(file_okay=False, path_type=Path), envvar="KATA_WORKSPACE",
    default=".", show_default="current folder, or $KATA_WORKSPACE",
    help="Folder holding your kata files and the kit's state (.kata/).")


def _workspace(path: Path) -> Workspace:
    ws = Workspace(path)
    if ws.warning:
        click.secho(f"warning: {ws.warning}", fg="yellow", err=True)
    return ws


def _kata(name: str) -> Kata:
    try:
        return manifest.find(name)
    except LookupError as exc:
        raise click.BadParameter(str(exc), param_hint="KATA") from None
    except ManifestError as exc:
        raise EnvironmentProblem(str(exc)) from None


def _full_kit(command: str):
    """Refuse, plainly, a command that needs the reference when this kit is a student bundle."""
    if bundle_info() is not None:
        raise EnvironmentProblem(NO_REFERENCE.format(command=command))


def _containment_note():
    """Self-study runs under bwrap where it can be had; otherwise one line says so."""
    from graders.engine.sandbox import fallback_note

    note = fallback_note()
    if note:
        click.secho(f"note: {note}", fg="yellow", err=True)


def _grading_sandbox(no_sandbox: bool, container: bool = False, private=()) -> str:
    """Before grading many files, the sandbox mode (see ``Grading``): bwrap's sandbox; with
    --container where bwrap cannot make namespaces, the grading container, when learner code can
    reach neither the kit nor ``private`` (SUBMISSIONS, OUT); or --no-sandbox, said aloud. Exit 2
    otherwise."""
    from graders.classroom.batch import NO_SANDBOX
    from graders.engine.sandbox import SandboxUnusable, container_problem, containment, sandbox_uid

    if no_sandbox and container:
        raise click.UsageError("--no-sandbox and --container contradict each other: give one.")
    if not no_sandbox:
        mode, why = containment(container)
        if mode == "bwrap":
            return mode
        if mode == "process":
            raise EnvironmentProblem(f"{why}. Grading runs learner code only in bubblewrap's sandbox; --no-sandbox "
                                     "grades without it (the grades are then not protected against cheating), and "
                                     "in a throwaway grading container --container grades as another user there.")
        problem = container_problem(private)
        if problem:
            raise EnvironmentProblem(f"{why}, and --container cannot grade in this container either: {problem}.")
        click.secho(f"note: {why}; learner code runs as an unprivileged user of this container (--container).",
                    fg="yellow", err=True)
        return mode
    click.secho(NO_SANDBOX, fg="yellow", err=True)
    try:
        sandbox_uid(isolated=False)
    except SandboxUnusable:
        click.secho("No other user can read Python's installation here, so learner code runs as root: "
                    "--no-sandbox asked for no sandbox.", fg="yellow", err=True)
    return "process"


def _no_sandbox_option(command):
    return click.option("--no-sandbox", is_flag=True,
                        help="Grade without bubblewrap's sandbox (not protected against cheating; every "
                             "result and summary.md say so).")(command)


def _jobs_option(what: str):
    return click.option("-j", "--jobs", type=click.IntRange(min=1), default=len(os.sched_getaffinity(0)),
                        envvar="KATA_JOBS", show_envvar=True, show_default="the number of CPUs",
                        help=f"{what} graded at the same time, each process with a Python of its own, and a "
                             f"torch for torch katas (on a machine shared with other work, fewer).")


def _container_option(command):
    return click.option("--container", is_flag=True,
                        help="This is a throwaway grading container (Gradescope's autograder passes it): use "
                             "bubblewrap's sandbox where it works, else run learner code as an unprivileged user "
                             "of the container, who must read neither the kit nor SUBMISSIONS and OUT (then "
                             "kata grade must run as root; otherwise it refuses and says why).")(command)


def _policy_options(command):
    """The policy flags for graded work, shared by every command that grades a class."""
    options = [
        click.option("--graded", is_flag=True, help="Graded work: the three rules below at once."),
        click.option("--banned-fails/--banned-counts", default=None,
                     help="A kata that uses a banned API scores 0 (self-study: only its banned-api check fails)."),
        click.option("--withhold-fixes/--show-fixes", default=None,
                     help="Feedback names each diagnosed bug and what it means, without the code that fixes it."),
        click.option("--hide-hidden-names/--show-hidden-names", default=None,
                     help="Learners see each hidden check only as 'hidden check i of n' (on Gradescope, after "
                          "the due date)."),
        click.option("--show-hidden-diagnoses/--hide-hidden-diagnoses", default=None,
                     help="Tell learners the diagnosis of a failed hidden check (never its inputs); not part of "
                          "--graded."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _deadline_options(command):
    """The due date and late policy, shared by `kata grade` and `kata gradescope`."""
    command = click.option("--late-penalty", metavar="POLICY",
                           help="none (lateness only said; the default), zero (late work scores 0) or N%/day (N "
                                "percent of the total per day or part of a day late); kept in the class file.")(command)
    return click.option("--due", metavar="DATETIME",
                        help="The due date, ISO 8601 with its time zone (2026-12-01T23:59+01:00), kept in the class "
                             "file: grades.csv and each learner's feedback then say when the work came and the late "
                             "penalty.")(command)


def _with_deadline(class_rules, due, late_penalty):
    try:
        return class_rules.with_deadline(due, late_penalty)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--due / --late-penalty") from None


def _policy(graded, banned_fails, withhold_fixes, hide_hidden_names, show_hidden_diagnoses) -> dict:
    """The policy flags given (None: as the class file says; --graded: each of its three not given is on)."""
    given = {"banned_fails": banned_fails, "withhold_fixes": withhold_fixes, "hide_hidden": hide_hidden_names}
    return {**{name: True if graded and on is None else on for name, on in given.items()},
            "show_hidden_diagnoses": show_hidden_diagnoses}


def _all_katas() -> tuple[Kata, ...]:
    try:
        return manifest.katas()
    except ManifestError as exc:
        raise EnvironmentProblem(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="attention-katas")
@click.option("--katas-dir", "katas_dirs", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A folder of a course's own katas (<slug>/kata.toml, ...), beside the kit's; repeat for more. "
                   f"The same as ${manifest.COURSE_KATAS} (os.pathsep between folders).")
def main(katas_dirs):
    """Attention katas: write softmax, masks, multi-head and grouped-query attention from
    scratch, and be told exactly what is wrong.

    Start with `kata list`, then `kata start softmax` and `kata check softmax`.
    """
    if katas_dirs:   # in the environment: the processes a command starts (grading pools, nbgrader) see them too
        given = [str(d.resolve()) for d in katas_dirs]
        known = [d for d in os.environ.get(manifest.COURSE_KATAS, "").split(os.pathsep) if d]
        os.environ[manifest.COURSE_KATAS] = os.pathsep.join(dict.fromkeys([*given, *known]))


def _track(ctx, param, name: str | None) -> str | None:
    """--track's value, a track's name (None: every track)."""
    if name is None:
        return None
    try:
        name = manifest.find_track(name).name
    except LookupError as exc:
        raise click.BadParameter(str(exc)) from None
    if not any(k.track == name for k in _all_katas()):   # a student bundle holds some katas only
        raise click.BadParameter(f"no kata here is on the {name} track.")
    return name


track_option = click.option("--track", callback=_track, metavar="TRACK",
                            help=f"Only the katas of TRACK ({', '.join(t.name for t in manifest.TRACKS)}).")


@main.command("list")
@track_option
@workspace_option
def list_(track, workspace):
    """List every kata by track, in order, with its difficulty and minutes, your status and best score."""
    ws = _workspace(workspace)
    katas = _all_katas()
    width, title_width = max(len(k.slug) for k in katas), max(len(k.title) for k in katas)
    # From the history, as `kata history` reads it: the last run's status and the best score.
    found = progress(katas, ws.history.entries("check"))
    for number, (group, members) in enumerate(manifest.by_track(katas)):
        if track is not None and group.name != track:
            continue
        if number and track is None:
            click.echo()
        click.echo(click.style(group.title, bold=True) + (f" (--track {group.name})" if group.name else ""))
        for kata in members:
            p = found[kata.slug]
            if p.checks:
                status, best = p.last_status, f"{p.best:g}/{p.best_max:g}"
            elif p.not_started:
                status, best = "not-started", ""
            else:
                status, best = ("started" if ws.file_for(kata).exists() else "-"), ""
            colour = "green" if status == "passed" else None
            click.echo(f"{kata.order:>2}. {kata.slug:<{width}}  {kata.framework:<6}  {kata.difficulty or '-':<6} "
                       f"{kata.minutes:>3} min  {kata.title:<{title_width}} {click.style(f'{status:<11}', fg=colour)} "
                       f"{best}".rstrip())


@main.command()
@click.argument("kata_name", metavar="KATA")
@workspace_option
def start(kata_name, workspace):
    """Copy KATA's stub into your workspace and show its task.

    An existing file is never overwritten: you keep your work.
    """
    kata = _kata(kata_name)
    ws = _workspace(workspace)
    ws.root.mkdir(parents=True, exist_ok=True)
    target = ws.file_for(kata)
    if target.exists():
        click.secho(f"{target} already exists: keeping it (`kata reset {kata.slug}` restores the stub, "
                    "after a backup).", fg="yellow")
    else:
        shutil.copyfile(kata.stub_path, target)
        click.echo(f"Created {target}")
    if (missing := needs_installing(kata)) is not None:
        click.secho(missing, fg="yellow")
    click.echo()
    click.echo(kata.readme_path.read_text(encoding="utf-8"))
    click.secho(f"Next: edit {target.name}, then run `kata check {kata.slug}`.", bold=True)


def _started(ws: Workspace, kata_name: str | None) -> list[tuple[Kata, Path]]:
    """The (kata, file) pairs to check: KATA's file, which must exist, or every started kata's."""
    if kata_name:
        kata = _kata(kata_name)
        path = ws.file_for(kata)
        if not path.exists():
            raise click.UsageError(f"{path} does not exist. Run `kata start {kata.slug}` first.")
        return [(kata, path)]
    jobs = [(k, ws.file_for(k)) for k in _all_katas() if ws.file_for(k).exists()]
    if not jobs:
        raise click.UsageError(f"No kata started in {ws.root}. `kata list` shows them; "
                               "`kata start softmax` begins the first.")
    for kata, _ in jobs:   # a kata whose framework is missing here is named, and the others checked
        if (missing := needs_installing(kata)) is not None:
            click.secho(f"skipped: {missing}", fg="yellow", err=True)
    return [(kata, path) for kata, path in jobs if needs_installing(kata) is None] or jobs


def _session_seed(seed: int | None) -> int:
    """The seed of a run: --seed, or a fresh one (a student bundle has only the one it recorded)."""
    bundle = bundle_info()
    if bundle is not None and seed not in (None, bundle["seed"]):
        raise click.UsageError(f"This student bundle recorded its expected values at seed {bundle['seed']} only: "
                               "leave out --seed (or give that one). Other seeds run when your instructor grades.")
    return (bundle["seed"] if bundle else new_seed()) if seed is None else seed


def _grade_and_record(ws: Workspace, kata: Kata, path: Path, *, seed: int, device: str, zygote=None) -> dict:
    """Grade one file the way `kata check` does (its sandbox forked from ``zygote``, where one is
    shared), and record the result in the workspace."""
    try:
        # Self-study replays hidden checks too: --seed draws their inputs as well.
        tapes = repro.folder_of(ws.meta, kata)   # `kata repro` makes scripts of its failed public checks
        if path.suffix == ".ipynb":
            shutil.rmtree(tapes, ignore_errors=True)
            result = grade_notebook(kata, path, seed=seed, device=device, hidden_seed=seed, zygote=zygote)
        else:
            result = grade(kata, path, seed=seed, device=device, hidden_seed=seed, zygote=zygote, repro=tapes)
    except RunnerError as exc:
        raise EnvironmentProblem(str(exc)) from None
    except ValueError as exc:   # a notebook without a solution cell
        raise click.BadParameter(str(exc), param_hint="--file") from None
    problem = ws.record_result(kata, result, scratch=not ws.owns(kata, path))
    if problem:
        click.secho(f"warning: {problem}", fg="yellow", err=True)
    return result


def _check_one(ws: Workspace, kata: Kata, path: Path, *, seed: int, device: str, zygote, as_json: bool) -> dict:
    """`kata check` of one file: graded, recorded, and shown (as JSON, or as people read it)."""
    result = _grade_and_record(ws, kata, path, seed=seed, device=device, zygote=zygote)
    if as_json:
        click.echo(json.dumps(result))
    else:
        own = path.resolve() == ws.file_for(kata).resolve()
        click.echo(render(result, kata, replay_with=replay(kata, seed, None if own else path.resolve())))
        click.echo()
    return result


@main.command()
@click.argument("kata_name", metavar="[KATA]", required=False)
@click.option("--file", "file", type=click.Path(dir_okay=False, path_type=Path),
              help="Grade this file instead of the workspace's.")
@click.option("--json", "as_json", is_flag=True, help="Print the result object(s) as JSON, one per line.")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True,
              help="Where your tensors live; auto uses CUDA when present. CUDA-only checks run on CUDA.")
@click.option("--seed", type=int, help="Replay a run: the same seed draws the same inputs.")
@workspace_option
def check(kata_name, file, as_json, device, seed, workspace):
    """Grade KATA (every started kata if none is given).

    --file may be a notebook (.ipynb): its solution cells are graded.
    Exit code 0 when everything passed, 1 when a check did not, 2 on a usage or environment error.
    """
    ws = _workspace(workspace)
    if file is not None:
        if not file.is_file():
            raise click.BadParameter(f"{file} does not exist.", param_hint="--file")
        jobs = [(_kata(kata_name or file.with_suffix(".py").name), file)]
    else:
        jobs = _started(ws, kata_name)
    seed = _session_seed(seed)
    _containment_note()
    results = []
    try:
        zygote = zygote_for([kata for kata, _ in jobs], device, warm=True) if len(jobs) > 1 else None
    except RunnerError as exc:
        raise EnvironmentProblem(str(exc)) from None
    with zygote or contextlib.nullcontext():
        for kata, path in jobs:
            results.append(_check_one(ws, kata, path, seed=seed, device=device, zygote=zygote, as_json=as_json))
    if not as_json and len(results) > 1:
        passed = sum(r["status"] == "passed" for r in results)
        click.echo(f"{passed} of {len(results)} katas passed  {bar(passed, len(results))}")
    sys.exit(0 if all(r["status"] == "passed" for r in results) else 1)


@main.command()
@click.argument("kata_name", metavar="[KATA]", required=False)
@click.option("--poll", is_flag=True, help="Look at the files every --interval seconds instead of waiting for "
              "change events.")
@click.option("--interval", type=click.FloatRange(min=0.05), default=0.5, show_default=True, metavar="SECONDS",
              help="How often polling looks at the files.")
@click.option("--seed", type=int, help="The seed of every check in this session (random if not given).")
@workspace_option
def watch(kata_name, poll, interval, seed, workspace):
    """Check KATA again each time you save it (every started kata if none is given).

    It checks KATA once, then again whenever its content changes; with no KATA, it checks each
    started kata's file when that file changes. One seed serves the whole session, so that
    results compare across saves: after each report, a line says which checks the save fixed
    and which it broke, and once the kata passes, what comes next (as `kata next` says). Change
    events come from the file system; --poll looks at the files every --interval seconds
    instead, and watch switches to polling by itself where events do not arrive (some network
    and container file systems). Ctrl-C stops.
    """
    from graders.practice.watch import Watcher, changed

    ws = _workspace(workspace)
    katas = {path: kata for kata, path in _started(ws, kata_name)}
    seed = _session_seed(seed)
    _containment_note()
    names = ", ".join(path.name for path in katas)
    click.echo(f"Watching {names}; every check uses seed {seed} (`--seed {seed}` draws the same inputs again).")
    interrupted = False
    last = {}   # each file's result at its last check of this session

    def interrupt(signum, frame):
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        # One zygote for the session: each check after a save costs a fork, not a Python start.
        with zygote_for(list(katas.values()), "auto", warm=True) as zygote, \
                Watcher(katas, poll=poll, interval=interval, say=click.echo) as watcher:
            if not kata_name:   # the started katas: each is checked when it is saved, not all first
                click.echo(f"Watching {names} (Ctrl-C to stop): each is checked when you save it.")
            for path in itertools.chain(katas if kata_name else (), watcher.changes()):
                click.secho(f"── {time.strftime('%H:%M:%S')} · {path.name} ".ljust(72, "─"), dim=True)
                try:
                    result = _grade_and_record(ws, katas[path], path, seed=seed, device="auto", zygote=zygote)
                except EnvironmentProblem:
                    if interrupted:   # pytest turns a Ctrl-C mid-check into a failed run
                        raise KeyboardInterrupt from None
                    raise
                click.echo(render(result, katas[path]))
                # The whole report each time (a failing check's values change with each save), then
                # the change in one line and, once the kata passes, the way on: `kata next`'s first.
                if path in last:
                    click.echo(changed(last[path], result))
                last[path] = result
                if result["status"] == "passed":
                    then = _suggestions(ws)[0]
                    click.secho(f"Passed. Next: {then.command} ({then.reason})", fg="green", bold=True)
                click.echo(f"\nWatching {names} (Ctrl-C to stop)")
    except KeyboardInterrupt:
        click.echo("\nStopped watching.")
    except RunnerError as exc:
        raise EnvironmentProblem(str(exc)) from None
    finally:
        signal.signal(signal.SIGINT, previous)


@main.command("repro")
@click.argument("kata_name", metavar="KATA")
@click.argument("check_id", metavar="[CHECK]", required=False)
@workspace_option
def repro_command(kata_name, check_id, workspace):
    """Write the check your last run of KATA failed as a script you can run, and run it.

    The first public check that failed (or CHECK) becomes repro/KATA.CHECK.py in your workspace:
    its inputs (the same as the run's), the call, what it should return, and an assertion. It runs
    your file directly, outside the kit's sandbox, so that an error shows your own traceback: print
    in it as you like. Hidden checks are never reproduced. Exit code 0 when the script passes.
    """
    kata = _kata(kata_name)
    ws = _workspace(workspace)
    try:
        made = repro.write(kata, repro.folder_of(ws.meta, kata), ws.root / "repro", check_id)
    except repro.ReproError as exc:
        raise click.UsageError(str(exc)) from None
    except RunnerError as exc:
        raise EnvironmentProblem(str(exc)) from None
    shown = os.path.relpath(made.script)
    click.echo(f"Wrote {shown}: the call `{made.check}` failed, with its inputs" + (
        ", what it should return and an assertion." if made.asserted else " (nothing to assert: the script says why)."))
    click.secho(f"$ python {shown}", bold=True)
    sys.stdout.flush()
    code = subprocess.run([sys.executable, str(made.script)], cwd=made.script.parent).returncode
    sys.exit(0 if code == 0 else 1)


@main.command()
@click.argument("kata_name", metavar="KATA")
@workspace_option
def hint(kata_name, workspace):
    """Show KATA's next hint, aimed at what your last `kata check` failed: the hints of the function
    its call names first, never a task whose checks pass. After a pass it says so, and goes on in
    task order."""
    kata = _kata(kata_name)
    ws = _workspace(workspace)
    choice, failed = ws.take_hint(kata)
    if choice.index is None:
        click.echo(f"{hints.none_left(kata, failed)} After a pass, `kata solution {kata.slug}` shows the reference.")
        return
    click.secho(hints.heading(kata, choice), bold=True)
    click.echo(kata.hints[choice.index].text)


@main.command()
@click.argument("kata_name", metavar="KATA")
@click.option("--force", is_flag=True, help="Show it before a pass (asks to confirm).")
@workspace_option
def solution(kata_name, force, workspace):
    """Show KATA's reference solution, once you have passed it."""
    _full_kit("solution")
    kata = _kata(kata_name)
    ws = _workspace(workspace)
    state = ws.kata_state(kata)
    if not state.get("passed"):
        if not force:
            raise click.ClickException(f"You have not passed {kata.slug} yet: `kata check {kata.slug}` first "
                                       "(or --force, if you really want to see it now).")
        click.confirm(f"You have not passed {kata.slug}. Seeing the solution now spoils the kata. Show it?",
                      abort=True)
        state["solution_seen_before_pass"] = True
        ws.save()
    click.echo(kata.reference_path.read_text(encoding="utf-8"))


@main.command()
@click.argument("kata_name", metavar="KATA")
@workspace_option
def reset(kata_name, workspace):
    """Restore KATA's stub, after backing up your file under .kata/backups/."""
    kata = _kata(kata_name)
    ws = _workspace(workspace)
    target = ws.file_for(kata)
    if target.exists():
        saved = ws.backup(target)
        click.echo(f"Backed up {target.name} to {saved}")
    ws.root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(kata.stub_path, target)
    click.echo(f"Restored the stub in {target}")


@main.command()
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True),
              help="Time for the coding part [default: the katas' estimates, or 30 to draw katas for].")
@click.option("--katas", "kata_names", multiple=True, metavar="KATA[,KATA...]",
              help="The katas to code (drawn at random to fill the time if not given).")
@click.option("--seed", type=int, help="Replay an interview: the same seed draws the same katas and questions.")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True,
              help="Where your tensors live when your code is checked.")
@workspace_option
def interview(minutes, kata_names, seed, device, workspace):
    """A mock interview: code katas against the clock, then answer follow-up questions.

    You code in fresh copies of the stubs under interviews/ in your workspace (your practice
    files are left alone), check as often as you like, and may ask for hints (each costs points).
    Then come 3 to 5 follow-up questions on the katas. The scorecard goes to your history
    (`kata history`). Exit code 0 when the interview was completed, 1 when it was abandoned.
    """
    ws = _workspace(workspace)
    chosen = _kata_list(kata_names) if kata_names else None
    seed = new_seed() if seed is None else seed
    _containment_note()
    drawn = interview_plan(_all_katas(), seed=seed, minutes=minutes, chosen=chosen)
    try:
        for kata in drawn.katas:   # no CUDA for --device cuda: say so before the clock starts
            resolve_device(kata, device)
        card = Interview(ws, drawn, device=device).run()
    except RunnerError as exc:
        raise EnvironmentProblem(str(exc)) from None
    click.echo(render_scorecard(card))
    click.echo("Saved to your history: `kata history` shows your progress, `kata next` what to practise.")
    sys.exit(0 if card["status"] == "completed" else 1)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print every history entry as JSON, one per line.")
@workspace_option
def history(as_json, workspace):
    """Your mock interviews and each kata's progress over time."""
    ws = _workspace(workspace)
    entries = ws.history.entries()
    if ws.history.skipped:
        click.secho(f"warning: {ws.history.skipped} unreadable line(s) in {ws.history.path} were skipped.",
                    fg="yellow", err=True)
    if as_json:
        for entry in entries:
            click.echo(json.dumps(entry))
        return
    if not entries:
        click.echo("No history yet: `kata check KATA` and `kata interview` add to it.")
        return
    interviews = [e for e in entries if e.get("type") == "interview"]
    if interviews:
        click.secho("Mock interviews", bold=True)
        for card in interviews:
            katas = ", ".join(c["kata"] for c in card["coding"])
            click.echo(f"  {card['time'][:16].replace('T', ' ')}  {card['score']:>5g}/{card['max_score']}  "
                       f"coding {card['coding_points']:g}, follow-ups {card['followups_right']}/"
                       f"{card['followups_asked']}, {card['hints']} hint(s)  {katas}"
                       + ("  (abandoned)" if card["status"] != "completed" else ""))
        scores = [c["score"] for c in interviews if c["status"] == "completed"]
        if len(scores) > 1:
            click.echo(f"  Trend over the last {min(len(scores), 10)}: "
                       + " -> ".join(f"{s:g}" for s in scores[-10:]))
    practised = [p for p in progress(_all_katas(), [e for e in entries if e.get("type") == "check"]).values()
                 if p.checks or p.scratch]
    if practised:
        click.secho("Katas", bold=True)
    for p in practised:
        scratch = f"  (and {p.scratch} run(s) of scratch files, not counted)" if p.scratch else ""
        if not p.checks:
            click.echo(f"  {p.kata.slug:<16}   0 check(s){scratch}")
            continue
        due = f"review due {p.due.isoformat()}" if p.due else "not passed yet"
        click.echo(f"  {p.kata.slug:<16} {p.checks:>3} check(s)  best {p.best:g}/{p.best_max:g}  "
                   f"last {p.last_time.strftime('%Y-%m-%d')} ({p.last_status})  {due}{scratch}")


@main.command("next")
@click.option("-n", "count", type=click.IntRange(min=1), default=3, show_default=True,
              help="How many suggestions.")
@track_option
@workspace_option
def next_(count, track, workspace):
    """What to practise next: the next kata on your track, then katas recently failed, never
    passed, or due for review.

    Your track is the one of the kata you checked last: its next kata not passed yet, then the
    next track's (`kata list` shows the tracks in order); --track asks for another. Passed katas
    come back for review after 1, 2, 4, 8 ... days (spaced repetition): each day you pass one with
    freshly written code doubles the wait, a failed check resets it.
    """
    ws = _workspace(workspace)
    for number, s in enumerate(_suggestions(ws, track)[:count], 1):
        click.echo(f"{number}. {click.style(s.kata.slug, bold=True)}: {s.reason}")
        click.echo(f"   {s.command}")


def _suggestions(ws: Workspace, track: str | None = None) -> list[Suggestion]:
    """`kata next`'s suggestions, from the workspace's history and files."""
    katas = _all_katas()
    started = {k.slug for k in katas if ws.file_for(k).exists()}
    return suggestions(katas, ws.history.entries("check"), started, track=track)


@main.command("notebook")
@click.argument("kata_name", metavar="KATA")
@workspace_option
def notebook_(kata_name, workspace):
    """Write KATA's self-study notebook (e.g. softmax.ipynb) into your workspace.

    It holds the task, a solution cell with the stub, and a check cell that grades that cell in
    the kit's sandbox. `kata check KATA --file softmax.ipynb` grades the saved notebook.
    """
    kata = _kata(kata_name)
    ws = _workspace(workspace)
    target = ws.root / Path(kata.learner_file).with_suffix(".ipynb")
    if target.exists():
        raise click.UsageError(f"{target} already exists: it is yours, so it is left alone. "
                               f"Move it away first for a fresh one.")
    ws.root.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(notebook(kata), indent=1) + "\n", encoding="utf-8")
    click.echo(f"Wrote {target}: open it in Jupyter, write your code in the solution cell, run the check cell.")


@main.command()
@click.argument("kata_name", metavar="KATA")
@click.option("--kind", help="Which of KATA's plots to draw; its first by default.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the PNG.  [default: <workspace>/<kata>-<kind>.png]")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the inputs the plot draws.")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True,
              help="Where your tensors live; auto uses CUDA when present.")
@click.option("--max-t", type=click.IntRange(min=128), default=2048, show_default=True,
              help="complexity: the longest sequence measured (T doubles from 64 up to it).")
@click.option("--file", "file", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw from this file instead of the workspace's (a notebook .ipynb: its solution cells).")
@workspace_option
def plot(kata_name, kind, out, seed, device, max_t, file, workspace):
    """Draw, from your code, the picture that teaches KATA, as a PNG.

    scaling-variance (curves): score spread and softmax saturation against d_k, per scale.
    causal-mask and mha (heatmaps): each head's attention weights over a short sentence.
    mha (complexity): time and peak memory of your forward as T doubles, against
    F.scaled_dot_product_attention on the same weights.
    cross-attention (heatmaps): each head's weights of a target sentence on a padded source.
    positional-encoding (encodings): your sinusoidal table as a heatmap and PE[p] · PE[p + k]
    against the offset k.
    flash-tiling (memory): peak memory of your flash_attention against a naive attention
    that builds the (T, T) scores, as T doubles.
    rope (rotation): your cos/sin table, and q · k against m − n at several positions.
    sliding-window (band): your band masks and the receptive field of stacked layers.
    doc-masking (documents): your document and prefix-LM masks of a packed row, and its positions.
    rope-scaling (frequencies): your frequency of each pair under PI, NTK, YaRN and Llama 3.1.
    linear-attention (weights): your causal weights against softmax's, and your decoding
    state's bytes against a KV cache's.
    prefix-cache (blocks): the blocks your cache gives each request of a stream, cache hits
    marked, and the tokens each request computes.
    spec-decode (tree): your draft tree at its positions, its tree_mask beside a chain's.
    roofline (roofline): your prefill and decode FLOPs per byte on an H100's roofline, and
    decode tokens per second against the batch size.
    ring-attention (ring): the ring's steps, your causal scores coloured by the rank that
    computes them, contiguous and zig-zag, and each rank's share of the work.
    Your code runs in the kit's sandbox, as for `kata check`; an existing file at --out is
    replaced only if it is a PNG.
    """
    from graders.practice import plots

    kata = _kata(kata_name)
    if not kata.plots:
        having = ", ".join(k.slug for k in _all_katas() if k.plots)
        raise click.UsageError(f"{kata.slug} has no plots; these katas have: {having}.")
    kind = kind or kata.plots[0]
    if kind not in kata.plots:
        raise click.BadParameter(f"{kata.slug} has no plot {kind!r}; it has {', '.join(kata.plots)}.",
                                 param_hint="--kind")
    if (kata.slug, kind) not in plots.PLOTS:
        raise EnvironmentProblem(f"{kata.dir / 'kata.toml'} lists the plot {kind!r}, which this kit cannot draw.")
    ws = _workspace(workspace)
    file = _own_file(ws, kata, file)
    out = out or ws.root / f"{kata.slug}-{kind}.png"
    if not out.parent.is_dir():
        raise click.BadParameter(f"the folder {out.parent} does not exist.", param_hint="--out")
    if plots.not_png(out):
        raise click.BadParameter(f"{out} exists and is not a PNG image: it is left alone.", param_hint="--out")
    with tempfile.TemporaryDirectory(prefix="kata-plot-") as tmp:
        _draw(kata, kind, _as_python(kata, file, Path(tmp)), out, seed=seed, device=device, max_t=max_t)
    click.echo(f"Wrote {out}")


def _own_file(ws: Workspace, kata: Kata, file: Path | None) -> Path:
    """The learner's file of ``kata``: --file, or the workspace's, which must exist."""
    if file is None:
        file = ws.file_for(kata)
        if not file.exists():
            raise click.UsageError(f"{file} does not exist. Run `kata start {kata.slug}` first.")
    elif not file.is_file():
        raise click.BadParameter(f"{file} does not exist.", param_hint="--file")
    return file


def _as_python(kata: Kata, file: Path, tmp: Path) -> Path:
    """``file``, or for a notebook its solution cells (as `kata check --file` grades them) written to
    a file of the kata's name in ``tmp``."""
    if file.suffix != ".ipynb":
        return file
    try:
        source = solution_source(file)
    except ValueError as exc:   # not a notebook, or one without a solution cell
        raise click.BadParameter(str(exc), param_hint="--file") from None
    file = tmp / kata.learner_file
    file.write_text(source, encoding="utf-8")
    return file


def _draw(kata: Kata, kind: str, file: Path, out: Path, **options):
    """Compute ``kind`` from the code in ``file`` and write it to ``out``, errors said as the CLI says them."""
    from graders.practice import plots

    try:
        plots.save(plots.draw(plots.compute(kata, kind, file, **options)), out)
    except plots.PlotFailed as exc:
        raise click.ClickException(str(exc)) from None
    except RunnerError as exc:
        raise EnvironmentProblem(str(exc)) from None
    except FileExistsError as exc:   # a file that appeared at --out while the plot was computed
        raise click.BadParameter(str(exc), param_hint="--out") from None


@main.command("run")
@click.argument("kata_name", metavar="KATA")
@click.option("--file", "file", type=click.Path(dir_okay=False, path_type=Path),
              help="Run this file instead of the workspace's (a notebook .ipynb: its solution cells).")
@workspace_option
def run_(kata_name, file, workspace):
    """Run KATA's README example with your code.

    The example is the README's "Try it" section: a few lines that call your functions and print
    what they give. `kata run` prints it, then says whether it is what the reference prints or
    shows the lines that differ: your values in seconds, before `kata check` grades every case.
    For tp-attention and ring-attention the example starts two ranks on this machine (gloo) and
    prints from each.
    It runs your own code, on your request, with this Python and outside the kit's sandbox, as
    `python` would; nothing is graded or recorded. Exit code 0 when it printed what the README
    shows, 1 when it raised, did not finish or printed something else, 2 on a usage error.
    """
    from graders.practice import run

    kata = _kata(kata_name)
    file = _own_file(_workspace(workspace), kata, file)
    try:
        source, expected = run.example(kata)
    except run.NoExample as exc:
        raise EnvironmentProblem(f"{kata.readme_path}: {exc}.") from None
    timeout = run.timeout_for(source)
    click.echo(f"The example of {kata.slug}'s README, with {file} (not in the kit's sandbox):\n")
    with tempfile.TemporaryDirectory(prefix="kata-run-") as tmp:
        outcome = run.run(kata, _as_python(kata, file, Path(tmp)), timeout=timeout,
                          echo=lambda line: click.echo(line, nl=False))
    if outcome.timed_out:
        raise click.ClickException(f"Stopped: the example did not finish in {timeout} s (a loop that never ends, "
                                   "or a rank waiting in a collective another rank never called?).")
    said = outcome.not_written
    if said is not None:
        raise click.ClickException(f"{file.name} is not written yet: it raises NotImplementedError"
                                   f"{f' ({said[:200]})' if said else ''}. Write it, then run this again.")
    click.echo(outcome.errors, nl=False, err=True)
    if outcome.returncode != 0:
        raise click.ClickException("The example stopped with the error above: your code raised it, or the "
                                   "example did on what your code returned.")
    differ = run.differences(outcome.printed, expected)
    if not differ:
        click.echo("\nSame as the README's: the reference prints these values too. `kata check "
                   f"{kata.slug}` grades every case.")
        sys.exit(0)
    click.echo(f"\n{len(differ)} {'lines differ' if len(differ) > 1 else 'line differs'} from the README's "
               "(what the reference prints):")
    for n, yours, readme in differ:
        click.echo(f"  line {n:<3} yours   {yours}\n           README  {readme}")
    sys.exit(1)


@main.group("nbgrader")
def nbgrader_():
    """nbgrader courses generated from the katas, autograded by the kit (needs the nbgrader extra: the
    instructor's install in docs/teaching.md)."""


@nbgrader_.command("init")
@click.argument("course", type=click.Path(file_okay=False, path_type=Path))
@click.option("--assignment", default="katas", show_default=True, help="The assignment's name.")
@click.option("--katas", "kata_names", multiple=True, metavar="KATA[,KATA...]",
              help="Only these katas (comma-separated or repeated); all by default.")
def nbgrader_init(course, assignment, kata_names):
    """Write an nbgrader course: nbgrader_config.py and source/ASSIGNMENT/<kata>.ipynb.

    Each notebook is generated from its kata: the task, the reference between solution
    delimiters (the released notebook holds the stub), and a graded test cell per check with its
    points, hidden checks between hidden-test delimiters. Then run `nbgrader generate_assignment
    ASSIGNMENT` in COURSE as usual.
    """
    from graders.classroom.course import init

    _full_kit("nbgrader init")
    try:
        written = init(course, assignment, _kata_list(kata_names))
    except FileExistsError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"Wrote {course / 'nbgrader_config.py'} and {len(written)} notebook(s) in {course / 'source' / assignment}.\n"
               f"Next: cd {course} && nbgrader generate_assignment {assignment}")


@nbgrader_.command("autograde")
@click.argument("course", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("assignment")
@click.option("--katas", "kata_names", multiple=True, metavar="KATA[,KATA...]",
              help="Only these katas (comma-separated or repeated); by default every kata the assignment holds.")
@_jobs_option("Notebooks")
@click.option("--force", is_flag=True, help="Grade every notebook again, even those graded already.")
@click.option("--replay", is_flag=True,
              help="Grade every notebook again at its recorded seeds, saving nothing, and say whether each "
                   "grade is the recorded one (exit 1 if one is not); the gradebook is left alone.")
@_policy_options
@_no_sandbox_option
def nbgrader_autograde(course, assignment, kata_names, jobs, force, replay, no_sandbox, **policy):
    """Grade COURSE/submitted/<student>/ASSIGNMENT/*.ipynb with the kit, in place of nbgrader autograde.

    The learners' solution cells are graded in the kit's sandbox (never in a kernel next to the
    test cells, where their code could patch the checks); each check's score becomes the auto
    score of its test cell, with the submission's time and late penalty as nbgrader computes them,
    and COURSE/autograded/ gets the graded notebooks, so `nbgrader generate_feedback`, `export`
    and the formgrader go on from there. The kit's records, feedback.md and results.json per
    student are in COURSE/kata/ASSIGNMENT/.
    """
    from graders.classroom import course as courses

    _full_kit("nbgrader autograde")
    if importlib.util.find_spec("nbgrader") is None:
        raise EnvironmentProblem("nbgrader is not installed here: in the kit's clone, pip install '.[nbgrader]' "
                                 "(the instructor's install in docs/teaching.md).")
    source = course / "source" / assignment
    courses.nbgrader_config(course)   # as nbgrader loads it: it names the course's own katas (`kata nbgrader init`)
    katas = [k for k in _kata_list(kata_names) if (source / f"{k.module}.ipynb").is_file()]
    if not katas:
        found = sorted(p.name for p in source.glob("*.ipynb")) if source.is_dir() else []
        raise click.UsageError(f"{source} holds no kata notebook: `kata nbgrader init` writes them." if not found else
                               f"{source} holds {', '.join(found)}, of no kata known here: a course's own kata is "
                               "found with `kata --katas-dir DIR` (or $KATA_KATAS_DIR).")
    if replay and (force or any(v not in (None, False) for v in policy.values())):
        raise click.UsageError("--replay grades by the course's recorded rules: give it neither --force nor a "
                               "policy flag.")
    sandbox = _grading_sandbox(no_sandbox)
    try:
        if replay:
            _said_replay(courses.replay(course, assignment, katas, jobs=jobs, sandbox=sandbox))
        results = courses.autograde(course, assignment, katas, jobs=jobs, sandbox=sandbox, policy=_policy(**policy),
                                    force=force)
    except (LookupError, rules.ClassFileError) as exc:
        raise EnvironmentProblem(str(exc)) from None
    for student, by_kata in results.items():
        total = sum(r["score"] for r in by_kata.values())
        most = sum(r["max_score"] for r in by_kata.values())
        click.echo(f"{student}: {total:g}/{most:g}")
    click.echo(f"Scores written to {course / 'gradebook.db'} and graded notebooks to {course / 'autograded'}: "
               f"`nbgrader generate_feedback {assignment}` and `nbgrader export` in {course} go on from here.")


def _names(values: tuple[str, ...]) -> list[str]:
    """The names of an option given comma-separated, repeated, or both."""
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def _kata_list(values: tuple[str, ...]) -> list[Kata]:
    names = _names(values)
    if not names:
        return list(_all_katas())
    chosen = {_kata(name).slug for name in names}
    return [k for k in _all_katas() if k.slug in chosen]


@main.command("grade")
@click.argument("submissions", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder for grades.csv, summary.md and each learner's results.json and feedback.md.")
@click.option("--katas", "kata_names", multiple=True, metavar="KATA[,KATA...]",
              help="The class's katas (comma-separated or repeated), kept in OUT's class file for later runs; "
                   "by default those the last run into OUT was given, else all.")
@_jobs_option("Pairs")
@click.option("--force", is_flag=True, help="Grade again pairs that are already graded and unchanged.")
@click.option("--learners", "learner_names", multiple=True, metavar="NAME[,NAME...]",
              help="Grade only these learners (comma-separated or repeated); the class files still cover "
                   "everyone graded into OUT.")
@click.option("--replay", is_flag=True,
              help="Grade the learners again at their recorded seeds, change nothing in OUT, and say for each "
                   "pair whether the grade is the same (exit 1 if one differs): how a re-grade request is checked.")
@click.option("--device", type=click.Choice(DEVICES), default="cpu", show_default=True,
              help="Where the graders run: every learner of a class on the same kind of device.")
@_deadline_options
@_policy_options
@_no_sandbox_option
@_container_option
def grade_class(submissions, out, kata_names, jobs, force, learner_names, replay, device, due, late_penalty,
                no_sandbox, container, **policy):
    """Grade a class: SUBMISSIONS/<learner>/<kata file> for every learner and kata.

    Writes OUT/grades.csv, OUT/summary.md (what the class got wrong) and, per learner,
    OUT/<learner>/results.json (Gradescope's format) and feedback.md. Each finished pair is saved
    at once: a second run skips pairs whose file and kit are unchanged, so an interrupted run
    resumes. Learner code runs in bubblewrap's sandbox (`apt-get install bubblewrap`), which
    sees neither the kit nor SUBMISSIONS nor OUT; without bwrap, grading refuses to run unless
    --no-sandbox is given.

    --container is for a throwaway grading container (Gradescope's autograder passes it) whose
    seccomp profile refuses the namespaces bwrap makes: there learner code runs as an
    unprivileged user of the container instead, and only if kata grade is root and that user can
    read neither the kit's files nor SUBMISSIONS nor OUT; every result and summary.md say
    "container". On a machine where bwrap works, --container changes nothing.

    The first run that grades anyone into OUT writes OUT/.kata/class.json: the class's secret,
    from which every learner's inputs are drawn (the same file always gets the same grade, here or
    on another machine given a copy of OUT; keep it, never hand it out), and the policy flags and
    --katas, which later runs keep unless told otherwise: the class files cover the class's katas.
    The other files are written as the umask says, so a course's group can read them; class.json
    is mode 0600. OUT/overrides.csv (learner,kata,score,reason), written by you, sets scores after
    grading, on every run.

    Under --due, a learner's work came when OUT/submitted.csv (learner,submitted: your course's
    record) says, else when the timestamp.txt of nbgrader's submit in their folder says, else at
    the newest time of their files; grades.csv names which.
    """
    _full_kit("grade")
    from graders.classroom.batch import Grading, OverridesError

    sandbox = _grading_sandbox(no_sandbox, container, private=(submissions, out))
    if out.resolve().is_relative_to(submissions.resolve()):
        raise click.BadParameter("OUT must not be inside SUBMISSIONS (it would be graded as a learner).",
                                 param_hint="--out")
    only = _names(learner_names) or None
    try:
        class_rules = rules.load(out) if replay else rules.load_or_new(out, **_policy(**policy))
    except rules.ClassFileError as exc:
        raise EnvironmentProblem(str(exc)) from None
    if replay and class_rules is None:
        raise click.UsageError(f"{out} holds no graded class to replay (no {rules.CLASS_FILE}).")
    class_rules = _with_deadline(class_rules, due, late_penalty)
    # The class's katas: those given, else those the class file keeps from the last run that gave them.
    known = {kata.slug for kata in _all_katas()}
    katas = _kata_list(kata_names or tuple(slug for slug in class_rules.katas if slug in known))
    class_rules = class_rules.with_katas(k.slug for k in katas)
    try:
        run = Grading(submissions, out, katas, jobs=jobs, force=force, rules=class_rules, device=device,
                      sandbox=sandbox, only=only)
    except OverridesError as exc:
        raise EnvironmentProblem(str(exc)) from None
    for name, why in run.refused_folders.items():
        click.secho(f"Not graded: {name}: {why}.", fg="yellow", err=True)
    # Before the class file is written: a run that has nobody to grade leaves OUT as it was (a new
    # class's secret is made by the run that grades it).
    if not run.learners:
        raise click.UsageError(f"{submissions} holds no learner folders (SUBMISSIONS/<learner>/<file>.py).")
    unknown = sorted(set(only or ()) - set(run.learners))
    if unknown:
        raise click.BadParameter(f"no learner folder {', '.join(unknown)} in {submissions}.", param_hint="--learners")
    if replay:
        _replay(run)
        return
    try:
        rules.save(out, class_rules)
    except OSError as exc:
        raise EnvironmentProblem(f"Could not write to {out}: {exc.strerror or exc}.") from None
    todo = run.todo()
    click.echo(f"Grading {len(run.learners if only is None else only)} learner(s) x {len(katas)} kata(s): "
               f"{len(todo)} pair(s) to grade, {len(run.pairs) - len(todo)} unchanged since their last grading; "
               f"seeds from the class secret in {out / rules.CLASS_FILE}.", err=True)
    for pair in run.pairs:   # files found under another name, or two candidates for one kata
        if pair.why or pair.error:
            click.echo(f"{pair.label}: {pair.error or pair.why}", err=True)
    # Pairs refused before grading (no file, a link out of the folder...) are done at once: they
    # count in neither the rate nor the time left.
    to_grade = {pair.label for pair in todo if run.refusal(pair) is None}
    started = time.perf_counter()
    done = set()   # the pairs saved, by label: one saved again as Ctrl-C stops the pool counts once
    with click.progressbar(length=len(todo), label="grading", show_pos=True, show_eta=False, file=sys.stderr,
                           item_show_func=lambda text: text) as progress:
        def advance(pair, result):
            if pair.label in done:
                return
            done.add(pair.label)
            graded = len(done & to_grade)
            progress.update(1, _progress_text(time.perf_counter() - started, graded, len(to_grade) - graded))

        try:
            run.run(todo, advance)
            run.write_class_files()
        except KeyboardInterrupt:
            again = ("run the same command again without --force to grade the rest (with it, every pair "
                     "is graded again)" if force else "run the same command again to grade the rest")
            click.echo(f"\nInterrupted: {len(done)} of {len(todo)} pair(s) graded and saved; {again}.", err=True)
            sys.exit(130)
        except OSError as exc:   # a full disk, a read-only OUT: what was saved stays saved
            raise EnvironmentProblem(f"Could not write to {out}: {exc.strerror or exc}. {len(done)} of {len(todo)} "
                                     "pair(s) were graded and saved; make room and run the same command again "
                                     "to grade the rest and write the class files.") from None
    elapsed = time.perf_counter() - started
    wrote = f"Wrote {out / 'grades.csv'}, {out / 'summary.md'} and {len(run.learners)} learner folder(s)."
    if todo:
        click.echo(f"Graded {len(todo)} pair(s) in {elapsed:.1f} s, {elapsed / len(todo):.2f} s per pair. {wrote}")
    else:
        click.echo(f"Nothing to grade: every pair is unchanged since its last grading (--force grades them "
                   f"again). {wrote}")


def _progress_text(elapsed: float, graded: int, left: int) -> str | None:
    """The grading bar's text, over the whole run: the rate of the pairs really graded, and the
    time the ``left`` pairs still to grade should take at it (click's own ETA averages recent
    steps, which pairs done at once make too fast, and soon forgets a slow one). None before the
    first pair is graded."""
    if not graded or elapsed <= 0:
        return None
    text = f"{graded / elapsed:.1f} pairs/s"
    if left:
        seconds = elapsed / graded * left
        text += f", about {max(1, round(seconds))} s left" if seconds < 100 else f", about {seconds / 60:.0f} min left"
    return text


def _replay(run):
    """Grade ``run``'s pairs again at their recorded seeds and say, pair by pair, whether the
    grade is what OUT recorded; exit 1 if one is not."""
    _said_replay(run.replay())


def _said_replay(replayed):
    differ = 0
    for pair, now, verdict in replayed:
        differ += verdict is not True
        line = f"{pair.label}: {now['score']:g}/{now['max_score']:g} ({now['status']}): "
        click.echo(line + ("the same grade as recorded." if verdict is True else verdict))
    sys.exit(1 if differ else 0)


@main.command()
@click.argument("kata_name", metavar="[KATA]", required=False)
@click.option("--seed", type=int, help="Seed for the graded runs (random if not given).")
@click.option("--deep", is_flag=True, help="Every rule, the graded ones at the seeds a class could draw, and "
              "the verdict recorded in the kata's lint.json, which the test suite checks.")
@click.option("--mutants", is_flag=True, help="Grade mutants of the references instead: how many small "
              "mistakes does each grader catch?")
@click.option("--seeds", type=click.IntRange(1), default=2, show_default=True,
              help="With --mutants: seeds each mutant is graded at (from --seed on).")
@click.option("--sample", type=click.IntRange(1), help="With --mutants: only the first N mutants of each kata.")
def lint(kata_name, seed, deep, mutants, seeds, sample):
    """Check the katas' content like code (for authors).

    Every rule that reads a kata's files (docs/authoring.md lists them), then the reference, the
    stub and every bug oracle graded at one seed: the reference must get full marks, the stub come
    out not-started, each bug oracle be caught with its own diagnosis.

    With --deep: every rule the test suite applies, the graded ones at each of the seeds a class
    could draw (every bug oracle and style-zoo file, the structure of every check's cases), and
    when all hold, the verdict recorded with the kata's fingerprint in katas/KATA/lint.json: commit
    it with the kata.

    With --mutants: each reference is changed in one small way at a time (operands or dims
    swapped, a transpose, scale or cast dropped, tril for triu, an off-by-one, a flipped mask...)
    and graded. A mutant is killed (below full marks at some seed), equivalent (it answered every
    call exactly as the reference did) or a survivor; each kata's grader must kill at least 95 %
    of the mutants that are not equivalent. Survivors are shown with their change.
    """
    _full_kit("lint")
    from graders.authoring import deep as deep_lint

    # A course's own kata is linted when named: every kata means the kit's.
    katas = [_kata(kata_name)] if kata_name else [k for k in _all_katas() if not k.folder]
    if deep and any(k.folder for k in katas):
        raise click.UsageError(f"{kata_name} is a course's own kata: --deep records the kit's katas for its test "
                               f"suite; `kata --katas-dir ... lint {kata_name}` checks yours.")
    seed = new_seed() if seed is None else seed
    if mutants:
        _lint_mutants(katas, list(range(seed, seed + seeds)), sample)
    if deep:
        click.echo(f"Linting {len(katas)} kata(s) deeply, at {len(deep_lint.SEEDS)} seeds")
    else:
        click.echo(f"Linting {len(katas)} kata(s) with seed {seed}")

    def show(finding):
        mark = click.style("✓", fg="green") if finding.ok else click.style("✗", fg="red")
        click.echo(f"  {mark} {finding.kata}: {finding.what}")

    findings = []
    try:
        for kata in katas:
            if not deep:
                findings += deep_lint.check(kata, seed=seed, progress=show)
                continue
            found, record = deep_lint.deep(kata, progress=show)
            findings += found
            click.echo(f"  {kata.slug}: " + (f"recorded in {record.relative_to(ROOT)}: commit it with the kata"
                                            if record else "nothing recorded: fix what is marked ✗ and run it again"))
    except RunnerError as exc:
        raise EnvironmentProblem(str(exc)) from None
    problems = [f for f in findings if not f.ok]
    click.echo(f"lint: {len(findings) - len(problems)} ok, {len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


@main.command("new")
@click.argument("slug")
@click.option("--framework", type=click.Choice(["torch", "numpy", "triton"]), default="torch", show_default=True,
              help="What the learner writes with.")
@click.option("--katas-dir", "into", type=click.Path(file_okay=False, path_type=Path),
              help="Write a course's own kata, every file in KATAS_DIR/SLUG/, outside the kit.")
def new_kata(slug, framework, into):
    """Write every file a new kata needs, in its place (for authors).

    A working kata to edit: its manifest, README and stub in katas/SLUG/, its reference and bug
    oracles in reference/, its graders in graders/, its own tests and style zoo in tests/, and its
    row in the README's table of katas. `kata lint SLUG` names every place still marked
    TODO(kata new); docs/authoring.md says what goes there.

    With --katas-dir, an exercise of a course's own: manifest, README, stub, reference, bug
    oracles, grader and hidden checks in KATAS_DIR/SLUG/ (docs/teaching.md, "An exercise of your
    own"); every command then takes it with `kata --katas-dir KATAS_DIR ...`.
    """
    _full_kit("new")
    from graders.authoring.new import NewKataError, write

    try:
        written = write(slug, framework, into.resolve() if into else None)
    except NewKataError as exc:
        raise click.UsageError(str(exc)) from None
    for path in written:
        click.echo(f"  wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    if into:
        click.echo(f"Next: edit them (docs/teaching.md, \"An exercise of your own\"), then `kata --katas-dir {into} "
                   f"check {slug} --file {into / slug / 'reference.py'}` gives full marks.")
    else:
        click.echo(f"Next: `kata lint {slug}` lists what is left to write; docs/authoring.md is the guide.")


def _lint_mutants(katas, seeds: list[int], sample: int | None):
    from graders.authoring import mutants

    click.echo(f"Grading mutants of {len(katas)} reference(s) at seed(s) {', '.join(map(str, seeds))}")
    scores = []
    for kata in katas:
        try:
            score = mutants.score(kata, seeds=seeds, sample=sample)
        except RunnerError as exc:
            raise EnvironmentProblem(str(exc)) from None
        scores.append(score)
        for line in mutants.survivors(score):
            click.echo(line)
    click.echo(mutants.table(scores))
    sys.exit(0 if all(s.ratio >= mutants.GOAL for s in scores) else 1)


@main.command("release")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="A new (or empty) folder for the student bundle.")
@click.option("--katas", "kata_names", multiple=True, metavar="KATA[,KATA...]",
              help="Bundle only these katas (comma-separated or repeated); all by default.")
@click.option("--seed", type=click.IntRange(0, rules.RELEASE_SEEDS - 1), default=release.DEFAULT_SEED,
              show_default=True,
              help="The one seed at which the bundle records expected values (its `kata check` uses it). "
                   f"Release seeds lie below {rules.RELEASE_SEEDS}, class grading seeds above: never an answer key.")
@click.option("--withhold-fixes", is_flag=True,
              help="For graded work: the bundle names each diagnosed bug and what it means, never its fix "
                   "(its manifests hold none).")
def release_(out, kata_names, seed, withhold_fixes):
    """Build a student bundle: the kit without reference/, bug oracles or hidden checks.

    OUT is an installable project (`pip install OUT`). Its `kata check` runs the public checks
    against expected values recorded here from the reference (diagnoses included, recorded from
    the bug oracles), and says that the hidden checks run when you grade.
    """
    katas = _kata_list(kata_names)
    click.echo(f"Recording {len(katas)} kata(s) at seed {seed} into {out} ...")
    try:
        release.build(out, katas, seed=seed, withhold_fixes=withhold_fixes,
                      progress=lambda text: click.echo(f"  {text}"))
    except (release.ReleaseError, RunnerError) as exc:
        raise EnvironmentProblem(str(exc)) from None
    click.echo(f"Wrote the student bundle {out}: `pip install {out}`, then `kata start {katas[0].slug}`.")


@main.command()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the zip, e.g. autograder.zip.")
@click.option("--katas", "kata_names", multiple=True, metavar="KATA[,KATA...]",
              help="Grade only these katas (comma-separated or repeated); all by default.")
@click.option("--class", "class_out", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The OUT of a class graded with `kata grade`: its secret and policy go in the zip "
                   "(by default a new secret, and the policy flags given here).")
@_deadline_options
@_policy_options
def gradescope(out, kata_names, class_out, due, late_penalty, **policy):
    """Build a Gradescope autograder zip that grades KATAS with this kit.

    Upload it as the assignment's autograder (Configure Autograder, zip file upload). Its setup.sh
    installs Python, the CPU build of the torch installed here and a wheel of this kit; its
    run_autograder grades the learner's files (softmax.py, causal_mask.py ...) with `kata grade`
    and always writes results.json, with score 0 and the reason when grading could not finish.
    The zip holds the class's secret, so a re-run of a submission gets the same grade: keep the
    zip away from learners. Under --due, the time Gradescope took the submission decides the late
    penalty, shown to the learner as a test of its own.
    """
    _full_kit("gradescope")
    from graders.classroom.gradescope import GradescopeError, build

    katas = _kata_list(kata_names)
    try:
        known = rules.load(class_out) if class_out else None
    except rules.ClassFileError as exc:
        raise EnvironmentProblem(str(exc)) from None
    if class_out and known is None:
        raise click.BadParameter(f"{class_out} holds no {rules.CLASS_FILE}: grade the class into it first.",
                                 param_hint="--class")
    try:
        built = build(out, katas, _with_deadline((known or rules.new()).with_policy(**_policy(**policy)), due,
                                                 late_penalty))
    except GradescopeError as exc:
        raise EnvironmentProblem(str(exc)) from None
    click.echo(f"Wrote {out} ({built['size'] / 1e6:.1f} MB): katas {', '.join(built['katas'])}; "
               f"{built['wheel']}; torch {built['torch']} (CPU build).")


if __name__ == "__main__":
    main()
