"""Kata manifests (``katas/<slug>/kata.toml``): parsed strictly, and the only list of katas.

Format 1, every key::

    format = 1                      # required
    slug = "softmax"                # required, equals the folder name
    title = "Numerically stable softmax"
    order = 1                       # position in `kata list`, unique
    framework = "numpy"             # numpy | torch | python
    summary = "one line"            # optional
    banned = ["torch.softmax"]      # optional: library shortcuts the kata forbids
    timeout_s = 10                  # optional: CPU seconds per call (the whole process tree's;
                                    # a wall-clock backstop is 5x, see sandbox.Budget)
    import_timeout_s = 10           # optional: the same, for running the learner's file at import
    memory_mb = 2048                # optional: the sandbox's memory cap
    minutes = 15                    # optional: time to solve it in a mock interview
    track = "seed"                  # optional (`kata lint` wants it): its track, one of TRACKS
    difficulty = "easy"             # optional (`kata lint` wants it): easy | medium | hard
    plots = ["heatmaps"]            # optional: what `kata plot` draws from the learner's code
    features = ["gqa"]              # optional: what the learner writes that a shared mistake
                                    # (katas/mistakes.toml) can occur in; `kata lint` wants each named
    [files]                         # optional: learner / stub / readme file names
    [tolerances.float32]            # optional: rtol and atol per dtype, and ulps: atol grows by
                                    # ulps * eps(dtype) * the input's magnitude (see tolerance)
    [[tasks]]                       # title and hints (kata lint wants one each), each hint a table
                                    # { for = [check ids or diagnosis codes], text = "..." }:
                                    # `kata hint` gives the hint for the check that failed;
                                    # functions = ["decode_step"]: the stub's functions and classes
                                    # the task writes (kata lint wants each named), whose failed
                                    # calls its hints answer first (practice/hints.py)
    [checks]                        # check id = points; ids are the grader's test names
    [builds_on]                     # optional: check id = [earlier check ids whose failure it
                                    # follows from]: reported as "same cause as", once
    [diagnoses.<code>]              # explain and fix: what the learner reads; or, for a mistake
                                    # of katas/mistakes.toml, shared = true, the library's texts, and
                                    # optionally this kata's own fix and a sentence `also` explains
    [[followups]]                   # interview follow-ups (questions.py has the format)
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from . import questions

FORMAT = 1
ROOT = Path(__file__).resolve().parents[2]   # the folder that holds katas/, graders/, reference/
KATAS_DIR = ROOT / "katas"
FRAMEWORKS = ("numpy", "torch", "python", "triton")
# The frameworks whose learner code runs on torch tensors: a Triton kata's launchers are torch code.
TORCH_FRAMEWORKS = ("torch", "triton")
DIFFICULTIES = ("easy", "medium", "hard")
# Machine epsilon of each dtype a tolerance may name (bfloat16 keeps 8 significant bits).
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


class ManifestError(Exception):
    """A manifest that does not follow format 1; the message says how to fix it."""


@dataclass(frozen=True)
class Track:
    name: str
    title: str


# The tracks a learner walks, in this order: `kata list` groups the katas by track and `kata next`
# continues the track the learner is on. A kata names its own (`track = "serving"`); the katas of
# a new stage add their track at the end.
TRACKS = (
    Track("seed", "The seed katas: softmax, masks, heads, multi-head and grouped-query attention, SDPA"),
    Track("beyond", "Beyond the seed: cross-attention, positions, the KV cache, FlashAttention, the backward pass"),
    Track("serving", "Serving: the decode roofline, paged and split KV caches, packed documents"),
    Track("architecture", "Architectures: latent attention, long context, linear attention, tensor parallelism"),
    Track("scale", "At scale: ring attention across ranks, speculative decoding, prefix caching, quantised KV caches"),
    Track("kernels", "Kernels in Triton: a fused softmax, FlashAttention's forward, paged decoding"),
)
NO_TRACK = Track("", "Other katas")   # where a kata that names no track is listed: a course's own, as a rule


@dataclass(frozen=True)
class Hint:
    text: str
    serves: tuple[str, ...]   # the check ids and diagnosis codes it helps with (its ``for``)


@dataclass(frozen=True)
class Task:
    title: str
    hints: tuple[Hint, ...]
    functions: tuple[str, ...] = ()   # the stub's functions and classes it writes


@dataclass(frozen=True)
class Diagnosis:
    code: str
    explain: str
    fix: str
    shared: bool = False   # a mistake of katas/mistakes.toml: its explanation is the library's


# A kata that judges structure (it declares `tampering`) also tells apart a library it does not
# allow (engine.structure.LIBRARIES): an honest learner's unused `import numpy` is no attempt on the grader.
IMPORT_NOT_ALLOWED = Diagnosis(
    "import-not-allowed",
    "Your file imports a library this kata does not allow (numpy in a torch kata, scipy, einops ...). That is no "
    "misconduct, but the checks that judge what your code calls cannot see inside a library the kata does not list, "
    "so they score 0; the other checks grade your results as usual.",
    "Remove the import, an unused one too, and write the code with the modules the check's message lists.")


@dataclass(frozen=True)
class Mistake:
    """A mistake that can be made in several katas (katas/mistakes.toml): one code, one
    explanation, for every kata that names it; it can occur in a kata whose ``features`` hold
    ``occurs``."""
    code: str
    occurs: str
    explain: str
    fix: str


@dataclass(frozen=True)
class Kata:
    slug: str
    title: str
    order: int
    framework: str
    dir: Path
    summary: str = ""
    banned: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()     # names the static check lets through for this kata (structure.tampering)
    timeout_s: float = 10.0
    import_timeout_s: float = 10.0
    memory_mb: int = 2048
    minutes: int = 15
    track: str = ""                 # a name of TRACKS, or "" (NO_TRACK)
    difficulty: str = ""            # one of DIFFICULTIES, or "" where the manifest names none
    plots: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    learner_file: str = ""
    stub_file: str = "stub.py"
    readme_file: str = "README.md"
    tolerances: dict = field(default_factory=dict)
    tasks: tuple[Task, ...] = ()
    checks: dict = field(default_factory=dict)
    builds_on: dict = field(default_factory=dict)
    diagnoses: dict = field(default_factory=dict)
    followups: tuple[questions.Question, ...] = ()
    paths: dict = field(default_factory=dict)   # files out of their usual place, by role (see ``files``)
    folder: bool = False   # a course's own kata: every file of it in its folder (see ``files``)

    @property
    def module(self) -> str:
        return self.slug.replace("-", "_")

    @property
    def files(self) -> dict[str, Path]:
        """Where each of the kata's files lies, by role: the one place a kata's paths are made.

        In ``katas/<slug>/``, what a learner is given: ``manifest``, ``readme``, ``stub``, and
        ``record`` (what `kata lint --deep` proved of the kata). In ``reference/``, the answers:
        ``reference``, ``bugs`` (its bug oracles), ``expected`` (expected values a grader writes
        out by hand; optional). In ``graders/``, the checks: ``grader`` and ``hidden``. In
        ``tests/``, the kata's own tests (``tests``) and its style ``zoo`` (a folder). A student
        bundle holds only the learner's files and the grader. ``paths`` moves any of them.

        A course's own kata (``folder``, written outside the kit: docs/teaching.md, "An exercise of
        your own") keeps them all in its folder: reference.py, bugs.py, expected.py, grader.py,
        hidden.py beside its manifest."""
        m = self.module
        if self.folder:
            named = {role: self.dir / f"{role}.py" for role in ("reference", "bugs", "expected", "grader", "hidden")}
            return {"manifest": self.dir / "kata.toml", "readme": self.dir / self.readme_file,
                    "stub": self.dir / self.stub_file, "record": self.dir / "lint.json", **named,
                    "tests": self.dir / "tests.py", "zoo": self.dir / "zoo", **self.paths}
        return {"manifest": self.dir / "kata.toml", "readme": self.dir / self.readme_file,
                "stub": self.dir / self.stub_file, "record": self.dir / "lint.json",
                "reference": ROOT / "reference" / f"{m}.py", "bugs": ROOT / "reference" / f"{m}_bugs.py",
                "expected": ROOT / "reference" / f"{m}_expected.py",
                "grader": ROOT / "graders" / f"{m}.py", "hidden": ROOT / "graders" / f"{m}_hidden.py",
                "tests": ROOT / "tests" / f"test_kata_{m}.py", "zoo": ROOT / "tests" / "zoo" / self.slug,
                **self.paths}

    def module_of(self, role: str) -> str:
        """The dotted module name of one of the kata's Python files (``reference.mha_bugs``); a
        course's own kata's files have names of their own (``_kata_dot_product_reference``)."""
        if self.folder:
            return f"_kata_{self.module}_{role}"
        return ".".join(self.files[role].relative_to(ROOT).with_suffix("").parts)

    def load(self, role: str):
        """The module of one of the kata's Python files, imported once a process: by its name in
        the kit, from its file for a course's own kata (whose folder is no package). A Triton kata's
        kernels run on Triton's interpreter here too, as in the sandbox: the values a grader
        expects come from the same arithmetic on any machine."""
        name = self.module_of(role)
        if self.framework == "triton":
            interpret_triton()
        if not self.folder:
            return importlib.import_module(name)
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, self.files[role])
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        return sys.modules[name]

    @property
    def stub_path(self) -> Path:
        return self.files["stub"]

    @property
    def readme_path(self) -> Path:
        return self.files["readme"]

    @property
    def grader_path(self) -> Path:
        return self.files["grader"]

    @property
    def reference_path(self) -> Path:
        return self.files["reference"]

    @property
    def hints(self) -> list[Hint]:
        return [hint for task in self.tasks for hint in task.hints]

    def task_of(self, hint: Hint) -> int:
        """The 1-based number of the task ``hint`` belongs to."""
        return next(i for i, task in enumerate(self.tasks, 1) if hint in task.hints)

    @property
    def max_score(self) -> float:
        return float(sum(self.checks.values()))

    def tolerance(self, dtype, magnitude: float = 0.0) -> dict:
        """rtol/atol for a dtype name such as "float32" (a NumPy or torch dtype works too).

        ``magnitude`` is the largest |value| of the inputs. A backward-stable computation may
        answer as if each input had moved by a few ulps of that magnitude: rounding x + 1000 in
        float32 moves it by 6e-5, and every honest softmax of it may be that far off. The atol
        grows by ``ulps`` (the manifest's count of such roundings) times eps(dtype) times it."""
        name = str(dtype).removeprefix("torch.")
        if name not in self.tolerances:
            raise KeyError(f"{self.slug}: kata.toml has no [tolerances.{name}]")
        tol = self.tolerances[name]
        return {"rtol": tol["rtol"], "atol": tol["atol"] + tol.get("ulps", 0.0) * EPS[name] * float(magnitude)}


_TOP = {"format", "slug", "title", "order", "framework", "summary", "banned", "allow", "timeout_s",
        "import_timeout_s", "memory_mb", "minutes", "track", "difficulty", "plots", "features", "files", "tolerances",
        "tasks", "checks", "builds_on", "diagnoses", "followups"}
_REQUIRED = ("format", "slug", "title", "order", "framework", "tasks", "checks")


def _fail(path: Path, message: str):
    raise ManifestError(f"{path}: {message}")


def _keys(path: Path, where: str, table: dict, allowed: set, required=()):
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            _fail(path, f"unknown key {key!r} in {where}.{hint} Known keys: {', '.join(sorted(allowed))}.")
    for key in required:
        if key not in table:
            _fail(path, f"{where} is missing the required key {key!r}.")


def _typed(path: Path, where: str, value, kind, what: str):
    if kind is float and type(value) is int:
        value = float(value)
    if type(value) is not kind:
        _fail(path, f"{where} must be {what}, not {type(value).__name__} {value!r}.")
    return value


def _strings(path: Path, where: str, value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        _fail(path, f"{where} must be a list of non-empty strings.")
    return tuple(value)


def parse(path: Path) -> Kata:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        _fail(path, f"not valid TOML: {exc}.")
    _keys(path, "the top level", data, _TOP, _REQUIRED)
    if data["format"] != FORMAT:
        _fail(path, f"format = {data['format']!r} is not supported; this kit reads format = {FORMAT}.")
    slug = _typed(path, "slug", data["slug"], str, "a string")
    if slug != path.parent.name:
        _fail(path, f"slug = {slug!r} must equal the folder name {path.parent.name!r}.")
    framework = data["framework"]
    if framework not in FRAMEWORKS:
        _fail(path, f"framework = {framework!r} must be one of {', '.join(FRAMEWORKS)}.")
    track = _typed(path, "track", data.get("track", ""), str, "a string")
    if "track" in data:
        try:
            find_track(track)
        except LookupError as exc:
            _fail(path, f"track = {track!r}: {exc}")
    difficulty = _typed(path, "difficulty", data.get("difficulty", ""), str, "a string")
    if "difficulty" in data and difficulty not in DIFFICULTIES:
        _fail(path, f"difficulty = {difficulty!r} must be one of {', '.join(DIFFICULTIES)}.")

    files = data.get("files", {})
    _keys(path, "[files]", files, {"learner", "stub", "readme"})
    tolerances = {}
    for dtype, tol in data.get("tolerances", {}).items():
        _keys(path, f"[tolerances.{dtype}]", tol, {"rtol", "atol", "ulps"}, ("rtol", "atol"))
        if dtype not in EPS:
            _fail(path, f"[tolerances.{dtype}]: unknown dtype; known: {', '.join(EPS)}.")
        tolerances[dtype] = {k: _typed(path, f"tolerances.{dtype}.{k}", v, float, "a number")
                             for k, v in tol.items()}


    checks = {}
    for check, points in data["checks"].items():
        points = _typed(path, f"checks.{check}", points, float, "a number of points")
        if points <= 0:
            _fail(path, f"checks.{check} = {points} must be positive.")
        checks[check] = points
    if not checks:
        _fail(path, "[checks] must give points to at least one check.")

    builds_on = {}
    order = list(checks)
    for check, earlier in data.get("builds_on", {}).items():
        earlier = _strings(path, f"builds_on.{check}", earlier)
        late = [e for e in earlier if e not in checks or check not in checks or order.index(e) >= order.index(check)]
        if late:
            _fail(path, f"builds_on.{check}: {', '.join(map(repr, late))} must be checks listed before {check!r} "
                        "in [checks].")
        builds_on[check] = earlier

    library = mistakes()
    features = _strings(path, "features", data["features"]) if data.get("features") else ()
    unknown = sorted(set(features) - {m.occurs for m in library.values()})
    if unknown:
        _fail(path, f"features: {', '.join(map(repr, unknown))} is no mistake's `occurs` in {MISTAKES.name}; known: "
                    f"{', '.join(sorted({m.occurs for m in library.values()}))}.")
    diagnoses = {}
    for code, entry in data.get("diagnoses", {}).items():
        where = f"[diagnoses.{code}]"
        if not entry.get("shared"):
            if code in library:
                _fail(path, f"{where} is a mistake several katas share: write `shared = true` and leave its "
                            f"explanation to {MISTAKES.name} (a `fix` of this kata's own and an `also` may follow).")
            _keys(path, where, entry, {"explain", "fix"}, ("explain", "fix"))
            diagnoses[code] = Diagnosis(code, entry["explain"].strip(), entry["fix"].strip())
            continue
        if code not in library:
            _fail(path, f"{where}: shared = true, but {MISTAKES.name} has no mistake {code!r}.")
        _keys(path, where, entry, {"shared", "fix", "also"})
        if entry["shared"] is not True:
            _fail(path, f"{where}: shared must be true (or left out).")
        also = _typed(path, f"{where} also", entry.get("also", ""), str, "a string").strip()
        fix = _typed(path, f"{where} fix", entry.get("fix", library[code].fix), str, "a string").strip()
        diagnoses[code] = Diagnosis(code, f"{library[code].explain} {also}".strip(), fix, shared=True)
    if "tampering" in diagnoses:
        diagnoses.setdefault(IMPORT_NOT_ALLOWED.code, IMPORT_NOT_ALLOWED)

    tasks = []
    if not isinstance(data["tasks"], list) or not data["tasks"]:
        _fail(path, "[[tasks]] must list at least one task.")
    for i, task in enumerate(data["tasks"], 1):
        _keys(path, f"[[tasks]] #{i}", task, {"title", "hints", "functions"}, ("title", "hints"))
        if not isinstance(task["hints"], list):
            _fail(path, f"tasks #{i} hints must be a list of hints.")
        hints = []
        for j, hint in enumerate(task["hints"], 1):
            where = f"tasks #{i} hint #{j}"
            if not isinstance(hint, dict):
                _fail(path, f"{where} must be a table {{ for = [check ids or diagnosis codes], text = \"...\" }}, "
                            f"not {type(hint).__name__}.")
            _keys(path, where, hint, {"for", "text"}, ("for", "text"))
            text = _typed(path, f"{where} text", hint["text"], str, "a string")
            serves = _strings(path, f"{where} for", hint["for"])
            unknown = [name for name in serves if name not in checks and name not in diagnoses]
            if not text.strip() or not serves or unknown:
                _fail(path, f"{where} needs a text and, in `for`, the checks or diagnosis codes it helps with"
                            + (f"; {', '.join(map(repr, unknown))} is neither a check nor a diagnosis of this kata."
                               if unknown else "."))
            hints.append(Hint(text, serves))
        functions = _strings(path, f"tasks #{i} functions", task.get("functions", []))
        if not all(name.isidentifier() for name in functions):
            _fail(path, f"tasks #{i} functions must name the stub's functions and classes: {list(functions)!r}.")
        tasks.append(Task(_typed(path, f"tasks #{i} title", task["title"], str, "a string"), tuple(hints), functions))

    followups = []
    for i, item in enumerate(data.get("followups", []), 1):
        try:
            followups.append(questions.parse(item, f"[[followups]] #{i}"))
        except questions.QuestionError as exc:
            _fail(path, str(exc))
        if [q.id for q in followups].count(followups[-1].id) > 1:
            _fail(path, f"[[followups]] #{i}: id {followups[-1].id!r} is used twice.")

    return Kata(
        slug=slug,
        title=_typed(path, "title", data["title"], str, "a string"),
        order=_typed(path, "order", data["order"], int, "an integer"),
        framework=framework,
        dir=path.parent,
        summary=_typed(path, "summary", data.get("summary", ""), str, "a string"),
        banned=_strings(path, "banned", data.get("banned", [])) if data.get("banned") else (),
        allow=_strings(path, "allow", data["allow"]) if data.get("allow") else (),
        timeout_s=_typed(path, "timeout_s", data.get("timeout_s", 10.0), float, "a number"),
        import_timeout_s=_typed(path, "import_timeout_s", data.get("import_timeout_s", 10.0), float, "a number"),
        memory_mb=_typed(path, "memory_mb", data.get("memory_mb", 2048), int, "an integer"),
        minutes=_typed(path, "minutes", data.get("minutes", 15), int, "an integer"),
        track=track,
        difficulty=difficulty,
        plots=_strings(path, "plots", data["plots"]) if data.get("plots") else (),
        features=features,
        learner_file=files.get("learner", slug.replace("-", "_") + ".py"),
        stub_file=files.get("stub", "stub.py"),
        readme_file=files.get("readme", "README.md"),
        tolerances=tolerances,
        tasks=tuple(tasks),
        checks=checks,
        builds_on=builds_on,
        diagnoses=diagnoses,
        followups=tuple(followups),
        folder=(path.parent / "grader.py").is_file(),
    )


MISTAKES = KATAS_DIR / "mistakes.toml"


@cache
def interpret_triton():
    """Run Triton's kernels on its interpreter in this process. Set before Triton is imported:
    triton.language's own functions (tl.max, tl.sum) are made for the interpreter or the compiler
    as it loads.

    The worker's hooks are set here too, so that a kernel's lanes outside its tensors read what
    they read in the sandbox (``other``, not this process's memory): a bug oracle that forgets its
    mask gives the learner's values, on any machine. Returns them (worker.kernel_tracer)."""
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.language as tl

    if type(tl.max).__name__ != "InterpretedFunction":
        raise RuntimeError("Triton was imported before the kit set TRITON_INTERPRET=1: its kernels would be compiled "
                           "for a GPU. Set TRITON_INTERPRET=1 in the environment of this process.")
    from .worker import kernel_tracer

    return kernel_tracer()


@cache
def mistakes(path: Path = MISTAKES) -> dict[str, Mistake]:
    """The mistakes several katas share, by code: ``[<code>]`` tables of ``occurs`` (the feature
    of a kata that lets it happen), ``explain`` and ``fix``. Read once per process: every kata's
    manifest names some of them."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        _fail(path, f"not valid TOML: {exc}.")
    found = {}
    for code, entry in data.items():
        if not isinstance(entry, dict):
            _fail(path, f"{code!r} must be a table [{code}] of occurs, explain and fix.")
        _keys(path, f"[{code}]", entry, {"occurs", "explain", "fix"}, ("occurs", "explain", "fix"))
        texts = [_typed(path, f"{code}.{key}", entry[key], str, "a string").strip() for key in ("occurs", "explain", "fix")]
        found[code] = Mistake(code, *texts)
    return found


COURSE_KATAS = "KATA_KATAS_DIR"   # folders of a course's own katas (os.pathsep between), as `kata --katas-dir` sets


def course_dirs() -> tuple[Path, ...]:
    """The folders of a course's own katas: ``$KATA_KATAS_DIR``, each holding ``<slug>/kata.toml``."""
    return tuple(Path(p).resolve() for p in os.environ.get(COURSE_KATAS, "").split(os.pathsep) if p)


def katas(root: Path | None = None) -> tuple[Kata, ...]:
    """Every kata, in order: the kit's (those of ``root`` when given) and a course's own
    (``course_dirs``). A broken manifest raises ManifestError naming the file."""
    return _katas((root,) if root is not None else (KATAS_DIR, *course_dirs()))


@cache
def _katas(roots: tuple[Path, ...]) -> tuple[Kata, ...]:
    found = [parse(p) for root in roots for p in sorted(root.glob("*/kata.toml"))]
    orders, slugs = {}, {}
    for kata in found:
        if kata.order in orders:
            raise ManifestError(f"{kata.dir / 'kata.toml'}: order = {kata.order} is also used by "
                                f"{orders[kata.order]!r}.")
        if kata.slug in slugs:
            raise ManifestError(f"{kata.dir / 'kata.toml'}: slug {kata.slug!r} is also the kata in {slugs[kata.slug]}.")
        orders[kata.order], slugs[kata.slug] = kata.slug, kata.dir
    return tuple(sorted(found, key=lambda k: k.order))


def by_track(katas: tuple[Kata, ...]) -> list[tuple[Track, list[Kata]]]:
    """The katas grouped by track, in the order of TRACKS (those of no track last), each group in
    the katas' order; a track without katas is left out."""
    groups = [(track, [k for k in katas if k.track == track.name]) for track in (*TRACKS, NO_TRACK)]
    return [(track, members) for track, members in groups if members]


def find_track(name: str) -> Track:
    """A track by name; LookupError names the closest one."""
    for known in TRACKS:
        if known.name == name:
            return known
    close = difflib.get_close_matches(name, [t.name for t in TRACKS], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise LookupError(f"no track named {name!r}.{hint} The tracks: {', '.join(t.name for t in TRACKS)}.")


def find(name: str) -> Kata:
    """A kata by slug; also accepts the learner file name (``causal_mask.py``) or module name."""
    key = name.removesuffix(".py").replace("_", "-")
    for kata in katas():
        if kata.slug == key:
            return kata
    close = difflib.get_close_matches(key, [k.slug for k in katas()], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise LookupError(f"no kata named {name!r}.{hint} `kata list` shows them all.")
