"""The benchmarks' shared harness: cases as data, one runner, one parser.

A benchmark is a list of :class:`Case` (a table row) and a function that fits
one run. :func:`main` fits the runs of the picked cases that the JSON does not
hold yet (resume), rewrites it after every run and renders it into the table
the docs include; ``--render-only`` rebuilds that table from the JSON alone.
The JSON holds ``meta``, ``rows`` (one per case, with the keys of its runs)
and ``runs`` (keyed ``part/setting/labels/draw``, each with its provenance).
"""

import argparse
import copy
import dataclasses
import fnmatch
import hashlib
import json
import os
import platform
import re
import shlex
import stat
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
# Benchmark the checkout the harness belongs to, installed or not.
sys.path.insert(0, str(REPO_ROOT))

# The results are written as skassoc writes its model files: one writer.
from skassoc._io._atomic import check_target, write_atomically  # noqa: E402

#: Confidence of the interval shown around each median.
MEDIAN_CONFIDENCE = 0.95
#: Most label draws of a case (``--draws``): far more than any table shows,
#: few enough to plan; the defaults benchmark tunes on the draws from here
#: on, never reported.
MAX_DRAWS = 1000
#: Images of MNIST's training and test sets.
MNIST_TRAIN_IMAGES, MNIST_TEST_IMAGES = 60_000, 10_000
#: Seeds go to NumPy's RandomState, which takes 0 to 2**32 - 1.
MAX_SEED = 2**32 - 1


@dataclasses.dataclass(frozen=True)
class Case:
    """One table row: ``draws`` runs keyed ``name/draw``. Run ``d`` draws its
    labels with seed ``d`` and fits with ``random_state=d``; with ``label_draw``
    set, run ``m`` takes that label draw and ``random_state=1000 m + label_draw``.
    ``params``: the estimator's (or ``method``'s) parameters; ``options`` go
    into the run's configuration as they are."""

    part: str
    setting: str
    labels: str
    params: dict
    draws: int = 1
    title: str = ""
    paper: str = ""
    method: str = "skassoc"
    fit_on: str = "all"
    label_draw: int | None = None
    options: dict = dataclasses.field(default_factory=dict)

    @property
    def name(self):
        return f"{self.part}/{self.setting}/{self.labels}"

    def seeds(self, draw):
        """(label seed, estimator seed) of run ``draw``."""
        if self.label_draw is None:
            return draw, draw
        return self.label_draw, 1000 * draw + self.label_draw


def device_description(device):
    """The GPU's name, or the CPU model and its number of logical CPUs."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    names = [ln.split(":")[1].strip() for ln in lines if ln.startswith("model name")]
    return f"{names[0] if names else platform.machine()}, {os.cpu_count()} logical CPUs"


def git_revision():
    """The checked-out commit ("-dirty" if tracked files changed), or None."""

    def git(*args):
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "HEAD") + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def source_digest(root=REPO_ROOT):
    """SHA-256 of the package's and the benchmarks' Python sources (a copy of
    the tree run elsewhere may carry older git metadata than its files)."""
    root = Path(root)
    digest = hashlib.sha256()
    files = sorted(
        [*(root / "skassoc").rglob("*.py"), *(root / "benchmarks").glob("*.py")]
    )
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def environment(device):
    """Machine, library versions and revision: every result file's header."""
    import sklearn
    import torch

    import skassoc

    return {
        "device": device_description(device),
        "device_type": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "sklearn": sklearn.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "skassoc": skassoc.__version__,
        "git_revision": git_revision(),
        "source_digest": source_digest(),
        "torch_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def extended_meta(meta, device, command):
    """A results file's ``meta`` after a run of ``command`` on ``device``:
    this environment, the commands so far and this one, the notes (keys
    ending in ``_note``) that say how earlier runs were made, and the
    tables' settings where the file has its own (titles: ``title`` and keys
    ending in ``_title``; ``held_out_from`` of bench_trust)."""
    kept = ("_note", "title", "held_out_from")
    notes = {k: v for k, v in meta.items() if k.endswith(kept)}
    commands = [*meta.get("commands", []), command]
    return {**environment(device), "commands": commands, **notes}


#: The refit of the user guide's label loop, as the tables name it: the fit
#: continued with the new labels, or a new fit where the continued fit's
#: report is suspect.
LOOP_REFIT = "warm start; a new fit if suspect"


def command_line(script, argv, python=False):
    """The command that ran ``script`` with ``argv``, quoted as a shell
    reads it (an argument with spaces stays one), after ``python`` with
    ``python``."""
    return shlex.join([*(["python"] if python else []), str(script), *argv])


def save_results(path, results, script, argv, device):
    """Write ``results`` to ``path``, their ``meta`` extended by this run of
    ``benchmarks/<script>`` with ``argv`` (``sys.argv``'s when None)."""
    argv = sys.argv[1:] if argv is None else argv
    command = command_line(f"benchmarks/{script}", argv, python=True)
    results["meta"] = extended_meta(results.get("meta", {}), device, command)
    write_json(path, results)


def publish_table(path, table):
    """Write ``table`` beside the results file ``path`` (``.rst``) and print it."""
    write_text(Path(path).with_suffix(".rst"), table)
    print(table)


def commands_text(meta):
    """The commands of a results file's ``meta`` as rST literals joined by
    "and", each once (a resumed run repeats its own command)."""
    return " and ".join(f"``{c}``" for c in dict.fromkeys(meta["commands"]))


def load_mnist_sets(data_home=None):
    """MNIST's training and test ``(X, y)`` from ``data_home``, $SKASSOC_MNIST_DIR
    or a shared/ copy (else where :func:`skassoc.datasets.load_mnist` looks)."""
    from skassoc.datasets import load_mnist

    candidates = [data_home, os.environ.get("SKASSOC_MNIST_DIR")]
    candidates += [root / "shared/data/mnist" for root in (REPO_ROOT.parent, REPO_ROOT)]
    home = next((str(c) for c in candidates if c and Path(c).is_dir()), data_home)
    return [load_mnist(s, data_home=home, return_X_y=True) for s in ("train", "test")]


def mnist_semi(args, label_seed, n_train=None):
    """MNIST's first ``n_train`` training images (all by default) with 10
    labels a class drawn with ``label_seed``: ``X, y_semi, X_test, y_test``."""
    from skassoc.datasets import make_semi_supervised_labels

    (X, y), (X_test, y_test) = load_mnist_sets(args.data_home)
    y_semi = make_semi_supervised_labels(y[:n_train], 10, random_state=label_seed)
    return X[:n_train], y_semi, X_test, y_test


def resolve_device(name):
    """The torch device of ``--device``; "auto" is a GPU when torch sees one."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise SystemExit(f"error: --device {name!r} is not a device ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"error: --device {name} was asked for, but torch sees no GPU")
    return device


def synchronize(device):
    """Wait for the GPU's queued work, so that a wall-clock time covers it."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def write_text(path, text):
    """Write ``text`` whole, with the writer of skassoc's model files: to a
    locked temporary file beside ``path``, renamed over it (a reader never
    sees half a file; a link at ``path`` is replaced, not written through;
    the replaced file's permissions are kept; a crashed writer's temporary
    file is removed by the next write).

    Raises
    ------
    ValueError
        If ``path`` exists and is not a regular file or a link.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8")
    write_atomically(os.fspath(path), lambda handle: handle.write(data), "results")


def write_json(path, data):
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def runs_file(parser, path, render_only):
    """The results of the runs kept in ``path`` (none yet: an empty file's),
    or ``parser``'s error for a render of a file that is not there."""
    if not Path(path).exists():
        if render_only:
            parser.error(f"--render-only needs {shown_path(path)}, which is not there")
        return {"runs": {}}
    return load_json(path)


def keep_titles(path, results, titles):
    """Put the tables' ``titles`` (meta key to title; None: unchanged) in
    ``results``' meta and write the file at once, so that every later run
    and render keeps them: two files shown on one page need headings of
    their own."""
    titles = {key: title for key, title in titles.items() if title}
    if titles:
        results.setdefault("meta", {}).update(titles)
        write_json(path, results)


def load_json(path):
    return json.loads(Path(path).read_text())


def read_results(path, problem=None):
    """The JSON object of the results file ``path``; a usage error that names
    the file and what is wrong with it where it cannot be read, is not a JSON
    object, or ``problem(data)`` returns what else is wrong with it."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            reason = "it is not a regular file"
        else:
            data = json.loads(Path(path).read_text())
            reason = None if isinstance(data, dict) else "it is not a JSON object"
    except FileNotFoundError:
        reason = "it does not exist"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = f"it cannot be read as JSON ({exc})"
    if reason is None and problem is not None:
        reason = problem(data)
    if reason:
        raise SystemExit(
            f"error: {path} is not a results file of this script: {reason}"
        )
    return data


def bounded_int(least, most=None):
    """An argparse ``type``: an integer from ``least`` to ``most`` (no limit
    with None), else a usage error that says so."""
    limits = f"from {least} to {most}" if most is not None else f"{least} or more"

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"takes an integer {limits}, not {text!r}"
            ) from None
        if value < least or (most is not None and value > most):
            raise argparse.ArgumentTypeError(f"takes an integer {limits}, not {value}")
        return value

    return parse


#: argparse ``type`` of a seed.
seed_int = bounded_int(0, MAX_SEED)


def make_parser(description, stem, cases=True):
    """The options every benchmark shares (those picking, drawing and merging
    cases with ``cases``); ``stem`` names the default files
    ``benchmarks/results/<stem>_<device>.json`` and ``.rst``."""
    parser = argparse.ArgumentParser(description=description)
    parser.set_defaults(stem=stem)
    add = parser.add_argument
    add("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    add("--data-home", default=None, help="folder of the data set's files")
    add("--json", help=f"results (default benchmarks/results/{stem}_<device>.json)")
    add("--table", help="rendered table (default: the JSON's path with .rst)")
    add("--render-only", action="store_true", help="rebuild the table from the JSON")
    parser.set_defaults(draws=None, only=None, max_iter=None, merge=None, shard=None)
    if cases:
        draws = bounded_int(1, MAX_DRAWS)
        add("--draws", type=draws, help="label draws of each case (default: its own)")
        add("--only", action="append", help="glob of part/setting/labels (repeat)")
        steps = bounded_int(1)
        add("--max-iter", type=steps, help="training steps of every fit (quick runs)")
        add("--merge", nargs="+", metavar="JSON", help="join these into --json")
        add("--shard", metavar="I/N", help="only every Nth run, from the Ith (0-based)")
    return parser


def parse(parser, argv=None):
    """Parse and check the shared options; fill in the default file paths."""
    args = parser.parse_args(argv)
    if args.shard is not None:
        args.shard = _shard(parser, args)
    args.json_given, args.table_given = args.json is not None, args.table is not None
    if args.merge and (not args.json_given or args.render_only):
        parser.error(
            "--merge writes the runs of its files, and only those, to --json: "
            "name --json (list it among the files to keep its runs), and "
            "leave out --render-only"
        )
    if args.json is None:
        device = args.device.split(":")[0]
        if device == "auto":
            device = resolve_device("auto").type
        args.json = str(RESULTS_DIR / f"{args.stem}_{device}.json")
    if args.table is None:
        args.table = str(Path(args.json).with_suffix(".rst"))
    check_targets(parser, args.json, args.table)
    return args


def check_targets(parser, *paths):
    """A usage error, before anything runs, where a path the script will
    write exists and is not a regular file."""
    for path in paths:
        try:
            check_target(os.fspath(path), "results")
        except FileNotFoundError:
            pass  # its folder is made when the results are written
        except ValueError as exc:
            parser.error(str(exc))


def _shard(parser, args):
    """``--shard I/N`` as ``(I, N)`` with ``0 <= I < N``, else a usage error."""
    match = re.fullmatch(r"(\d+)/(\d+)", args.shard, re.ASCII)
    if not match or int(match[1]) >= int(match[2]):
        parser.error(f"--shard takes I/N with 0 <= I < N, e.g. 0/4, not {args.shard!r}")
    if args.json is None:
        # Shards writing one file at once would overwrite each other's runs.
        parser.error("--shard needs its own --json file (join them with --merge)")
    if args.merge or args.render_only:
        parser.error("--shard runs cases; it does not go with --merge or --render-only")
    return int(match[1]), int(match[2])


def scaled_schedule(params, max_iter):
    """``params`` trained for ``max_iter`` steps, the decay interval and the
    warm-up scaled alike."""
    params = dict(params)
    old = params.get("max_iter", "auto")
    for name, least in (("lr_decay_steps", 1), ("lr_warmup_steps", 0)):
        steps = params.get(name, "auto")
        if isinstance(old, int) and isinstance(steps, int):
            params[name] = max(least, round(steps * max_iter / old))
    params["max_iter"] = max_iter
    return params


def config_of(case, draw, args, device_type, common):
    """What run ``draw`` of ``case`` is trained with (its signature's input)."""
    label_seed, seed = case.seeds(draw)
    params = dict(case.params)
    if case.method == "skassoc":
        if args.max_iter is not None:
            params = scaled_schedule(params, args.max_iter)
        params.update(device=device_type, random_state=seed)
    config = dict(method=case.method, params=params, labels=case.labels)
    config.update(label_seed=label_seed, fit_on=case.fit_on)
    return {**config, **case.options, **common}


def plan(cases, args, device_type, common):
    """Table rows of the picked cases, and their runs grouped by signature."""
    rows, jobs = [], {}
    for case in cases:
        if args.only and not any(fnmatch.fnmatchcase(case.name, p) for p in args.only):
            continue
        draws = args.draws or case.draws
        keys = [f"{case.name}/{d}" for d in range(draws)]
        configs = [config_of(case, d, args, device_type, common) for d in range(draws)]
        # Short hashes of the configurations: equal hashes, identical runs.
        texts = [json.dumps(c, sort_keys=True, default=str).encode() for c in configs]
        signatures = [hashlib.sha1(text).hexdigest()[:16] for text in texts]
        for key, config, signature in zip(keys, configs, signatures, strict=True):
            job = jobs.setdefault(signature, {"config": config, "keys": []})
            job["keys"].append(key)
        row = dict(part=case.part, setting=case.setting, labels=case.labels)
        row.update(title=case.title or case.setting, paper=case.paper, draws=draws)
        rows.append({**row, "keys": keys, "signatures": signatures})
    return rows, jobs


def merge_rows(rows, new_rows, prefer_new=False):
    """Rows of both lists, one per (part, setting, labels): the new one with
    ``prefer_new``, else the one with more draws."""
    merged = {(r["part"], r["setting"], r["labels"]): r for r in rows}
    for row in new_rows:
        old = merged.get((row["part"], row["setting"], row["labels"]))
        if old is None or prefer_new or row["draws"] > old["draws"]:
            merged[row["part"], row["setting"], row["labels"]] = row
    return list(merged.values())


#: What every table row and every finished run of a results file holds.
ROW_KEYS = {"part", "setting", "labels", "title", "paper", "draws", "keys"}
RUN_KEYS = {"key", "test_error_percent", "fit_seconds"}


def results_problem(results):
    """What keeps ``results`` from being a results file of :func:`main`, or None."""
    rows, runs = results.get("rows"), results.get("runs")
    if not isinstance(results.get("meta"), dict):
        return '"meta" is not a JSON object'
    if not isinstance(rows, list) or not all(
        isinstance(row, dict) and ROW_KEYS <= row.keys() for row in rows
    ):
        return f'"rows" is not a list of rows with the keys {sorted(ROW_KEYS)}'
    if not isinstance(runs, dict) or not all(
        isinstance(r, dict) for r in runs.values()
    ):
        return '"runs" is not a JSON object of runs'
    finished = [r for r in runs.values() if r.get("status") == "ok"]
    if not all(RUN_KEYS <= run.keys() for run in finished):
        return f"a finished run lacks one of the keys {sorted(RUN_KEYS)}"
    return None


def check_device(path, held, device_type):
    """Refuse to add runs on ``device_type`` to the file ``path`` of runs on
    ``held`` (None: unknown): one table, one device."""
    if held is not None and held != device_type:
        raise SystemExit(
            f"error: {path} holds runs on {held}, and this run is on "
            f"{device_type}; one results file holds the runs of one device. "
            f"Name another --json, or run with --device {held}."
        )


def merge(paths):
    """One results dict from several JSON files of one device (e.g. one per GPU)."""
    runs, rows, metas = {}, [], []
    for path in paths:
        old = read_results(path, results_problem)
        meta = old.get("meta", {})
        held = next((m["device_type"] for m in metas if "device_type" in m), None)
        if held is not None and meta.get("device_type", held) != held:
            raise SystemExit(
                f"error: --merge joins the files of one device: {path} holds "
                f"runs on {meta['device_type']}, the files before it on {held}."
            )
        metas.append(meta)
        for key, record in old.get("runs", {}).items():
            # Of two records of one run, a finished one, then the later one.
            records = [r for r in (record, runs.get(key)) if r is not None]
            runs[key] = max(
                records, key=lambda r: (r.get("status") == "ok", r.get("started", ""))
            )
        rows = merge_rows(rows, old.get("rows", []))
    meta = {**(metas[0] if metas else {}), "merged_from": list(map(str, paths))}
    shards = [shard for m in metas for shard in _shards(m)]
    return {"meta": {**meta, "shards": shards}, "rows": rows, "runs": runs}


def _shards(meta):
    """The metas behind ``meta``, listed rather than nested so that merging
    into a merged file again keeps its size: a merged file's own meta (that
    of the last process that added runs to it, with the files it was merged
    from), then its shards'."""
    if "shards" not in meta:
        return [meta]
    own = {key: value for key, value in meta.items() if key != "shards"}
    return [own] + [shard for inner in meta["shards"] for shard in _shards(inner)]


def main(cases, args, fit, render, load_data, common=None):
    """Run the picked cases (resuming from ``args.json``), then render the table:
    ``fit(config, load_data(args), device)`` returns a run's measurements (at
    least ``test_error_percent`` and ``fit_seconds``), ``render(results)`` text."""
    json_path = Path(args.json)
    if args.render_only:
        return measure_main(args, None, render)
    if args.merge:
        return _save(merge(args.merge), args, render)
    device = resolve_device(args.device)
    results = {"meta": {}, "rows": [], "runs": {}}
    if json_path.exists():
        results = read_results(json_path, results_problem)
        check_device(json_path, results["meta"].get("device_type"), device.type)
    common = dict(common or {})
    rows, jobs = plan(cases, args, device.type, common)
    jobs = list(jobs.items())
    if args.shard:
        # One process per GPU, each its own --json, joined by --merge.
        index, count = args.shard
        jobs = jobs[index::count]
    results["meta"].update(environment(device))
    results["meta"]["command"] = command_line(Path(sys.argv[0]).name, sys.argv[1:])
    results["rows"] = merge_rows(results["rows"], rows, prefer_new=True)
    runs = results["runs"]
    finished = {r.get("signature"): r for r in runs.values() if r.get("status") == "ok"}
    check_precision([job for s, job in jobs if s not in finished], runs, device)
    data = None
    for index, (signature, job) in enumerate(jobs, 1):
        keys = job["keys"]
        label = f"[{index}/{len(jobs)}] {keys[0]}"
        source = finished.get(signature)
        if source is None:
            if data is None:
                data = load_data(args)
                results["meta"].update(getattr(data, "meta", {}))
            print(f"{label}: training ...", flush=True)
            source = _fit_run(signature, job["config"], fit, data, device, results)
            if source["status"] == "ok":
                finished[signature] = source
                print(f"{label}: error {source['test_error_percent']:.2f}%", flush=True)
        for key in keys:
            old = runs.get(key, {})
            if old.get("signature") == signature and old.get("status") == "ok":
                continue
            part, setting, labels, draw = key.rsplit("/", 3)
            ident = dict(key=key, part=part, setting=setting, labels=labels)
            shared = [k for k in keys if k != key]
            runs[key] = copy.deepcopy(source) | ident | {"draw": int(draw)}
            runs[key]["shared_with"] = shared
        write_json(json_path, results)
    results["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    return _save(results, args, render)


#: Networks that take rows: ``precision="auto"`` treats them apart.
ROW_NETWORKS = ("mlp", "sparse_mlp")
#: What ``precision="auto"`` chose on a GPU before it chose bf16 for images;
#: results written then record no precision.
AUTO_ON_GPU_BEFORE_BF16 = "tf32"


def check_precision(jobs, runs, device):
    """Refuse to add runs to a row whose finished runs trained in another
    precision (``"auto"`` chose TF32 on GPUs before it chose bf16), which
    would mix two arithmetics in one median."""
    by_row = {}
    for name, run in runs.items():
        if run.get("status") == "ok":
            by_row.setdefault(name.rsplit("/", 1)[0], []).append(run)
    for job in jobs:
        params = job["config"].get("params", {})
        if job["config"].get("method", "skassoc") != "skassoc":
            continue
        images = params.get("network") not in ROW_NETWORKS
        new = resolved_precision(params, device, images)
        for row in {key.rsplit("/", 1)[0] for key in job["keys"]}:
            old = {run_precision(r, device, images) for r in by_row.get(row, [])}
            if old - {new}:
                raise SystemExit(
                    f"error: row {row} holds runs trained in {sorted(old)}, and "
                    f"its new runs would train in {new!r} on this device: name "
                    "the precision in the case's parameters, or give the runs a "
                    "row (setting) of their own."
                )


def run_precision(run, device, images):
    """The precision a finished run trained in: recorded, or for runs from
    before it was recorded, what ``"auto"`` chose then (TF32 on a GPU)."""
    if "precision" in run:
        return run["precision"]
    params = run.get("config", {}).get("params", {})
    if params.get("precision", "auto") == "auto" and device.type == "cuda":
        return AUTO_ON_GPU_BEFORE_BF16
    return resolved_precision(params, device, images)


def _fit_run(signature, config, fit, data, device, results):
    record = {"signature": signature, "config": config}
    record.update({k: results["meta"][k] for k in ("device", "git_revision")})
    record["source_digest"] = results["meta"]["source_digest"]
    record["started"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    start = time.perf_counter()
    try:
        record.update(fit(config, data, device))
        record["status"] = "ok"
    except Exception as exc:  # keep going: one failed run is one entry
        traceback.print_exc()
        record.update(status="error", error=f"{type(exc).__name__}: {exc}")
        print(f"{config}: FAILED ({record['error']})", flush=True)
    record["seconds_total"] = time.perf_counter() - start
    return record


def _save(results, args, render):
    write_json(args.json, results)
    write_table(args, render(results))
    return results


def shown_path(path):
    """``path`` as a message shows it: relative to the repository when inside
    it, so that output and logs do not carry the machine's folders."""
    try:
        return Path(path).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def write_table(args, text):
    """Print ``text`` and write it, with a final newline, to ``--table``."""
    written = f"results {shown_path(args.json)}"
    if args.table:
        write_text(args.table, text + "\n")
        written += f", table {shown_path(args.table)}"
    print(f"{text}\n\n{written}")


def measure_main(args, measure, render):
    """For the scripts without cases: ``measure(args)`` written to ``--json``
    (read from it with ``--render-only``), then ``render(results)``, unless
    None, to ``--table``."""
    if args.render_only:
        if not Path(args.json).is_file():
            shown = shown_path(args.json)
            raise SystemExit(f"error: --render-only needs the results {shown}")
        results = read_results(args.json)
    else:
        results = measure(args)
        write_json(args.json, results)
    text = render(results)
    if text is not None:
        write_table(args, text)
    return results


def timed(function, device):
    """``function()`` and its wall seconds, the GPU's queued work included."""
    synchronize(device)
    start = time.perf_counter()
    result = function()
    synchronize(device)
    return result, time.perf_counter() - start


def timed_fit(X, y, params, device, **fit_params):
    """The estimator of ``params`` fitted, and the wall seconds of its fit."""
    from skassoc import SemiSupervisedAssociationClassifier

    clf = SemiSupervisedAssociationClassifier(**params)
    return timed(lambda: clf.fit(X, y, **fit_params), device)


def fit_estimator(params, X, y, X_test, y_test, device, validation=False):
    """Fit one SemiSupervisedAssociationClassifier and score its last step; with
    ``validation`` also every ``validation_interval`` steps, and record the lowest."""
    extra = {"X_val": X_test, "y_val": y_test} if validation else {}
    clf, seconds = timed_fit(X, y, {**params, "device": str(device)}, device, **extra)
    out = {"fit_seconds": seconds}
    if validation:
        steps = clf.history_["validation_step"]
        # Rounded: 100 * (1 - accuracy) carries float noise (0.8399...).
        errors = [round(100.0 * (1.0 - s), 6) for s in clf.history_["validation_score"]]
        lowest = int(np.argmin(errors))
        out.update(test_error_steps=steps, test_errors_percent=errors)
        out["lowest_test_error_percent"] = errors[lowest]
        out["lowest_test_error_step"] = steps[lowest]
    out["n_iter"] = int(clf.n_iter_)
    return {**out, **scores(y_test, clf.predict(X_test))}


def resolved_precision(params, device, images):
    """The arithmetic a fit of ``params`` uses on ``device`` (what ``"auto"``
    chooses there), for the run's record: the estimator keeps it private."""
    import torch

    from skassoc._settings import resolve_precision

    precision = params.get("precision", "auto")
    return resolve_precision(precision, torch.device(device), images)


def error_percent(y_pred, y_true):
    """The share (%) of ``y_pred`` that differs from ``y_true``."""
    return 100.0 * float(np.mean(np.asarray(y_pred) != y_true))


def scores(y_true, y_pred):
    """Test error (%), the three most frequent confusions ``[true, predicted,
    count]`` and the test indices of the first of them."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    pairs, counts = np.unique(
        np.stack([y_true, y_pred])[:, y_true != y_pred], axis=1, return_counts=True
    )
    order = np.argsort(-counts, kind="stable")[:3]
    confused = [[int(pairs[0, i]), int(pairs[1, i]), int(counts[i])] for i in order]
    indices = []
    if confused:
        true, predicted, _ = confused[0]
        indices = np.flatnonzero((y_true == true) & (y_pred == predicted)).tolist()
    return {
        "n_eval": int(len(y_true)),
        "test_error_percent": error_percent(y_pred, y_true),
        "most_confused": confused,
        "most_confused_indices": indices,
    }


def _aligned(header, cells, right, sep):
    """The columns' widths, and a function that joins one row's values padded
    to them (right-aligned where ``right[i]``)."""
    widths = [max(len(str(r[i])) for r in [header, *cells]) for i in range(len(header))]

    def line(values):
        return sep.join(
            str(v).rjust(w) if r else str(v).ljust(w)
            for v, w, r in zip(values, widths, right)
        ).rstrip()

    return widths, line


def rst_table(header, cells, right=True, sep="  "):
    """A reStructuredText simple table, the first column left-aligned and the
    others right-aligned (left-aligned without ``right``)."""
    right = [bool(i and right) for i in range(len(header))]
    widths, line = _aligned(header, cells, right, sep)
    border = sep.join("=" * w for w in widths)
    return "\n".join([border, line(header), border, *(line(c) for c in cells), border])


def text_table(header, cells, sep="  "):
    """A plain-text table for a terminal: the header, a rule of dashes and the
    rows, a column of numbers right-aligned and the others left-aligned."""

    def number(value):
        try:
            float(value)
        except (TypeError, ValueError):
            return False
        return True

    right = [
        bool(cells) and all(number(c[i]) for c in cells) for i in range(len(header))
    ]
    widths, line = _aligned(header, cells, right, sep)
    rule = sep.join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(c) for c in cells)])


def fmt(value, digits=2):
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def median_interval(values, confidence=MEDIAN_CONFIDENCE):
    """Distribution-free confidence interval of the median of ``values``: x(k) and
    x(n + 1 - k) for the largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence)
    / 2; None with too few values (fewer than 6 at 95 %)."""
    from scipy.stats import binom

    values = np.sort(np.asarray(values, dtype=float))
    n = len(values)
    k = int(np.sum(binom.cdf(np.arange(n // 2), n, 0.5) <= (1 - confidence) / 2))
    return None if k == 0 else (float(values[k - 1]), float(values[n - k]))


def finished_runs(row, runs):
    """The finished runs of a row trained with the row's own settings."""
    expected = row.get("signatures") or [None] * len(row["keys"])
    return [
        runs[key]
        for key, signature in zip(row["keys"], expected, strict=True)
        if key in runs
        and runs[key].get("status") == "ok"
        and signature in (None, runs[key].get("signature"))
    ]


def row_start(row, done):
    """A row's first cells: its title, labels and finished (of planned) runs."""
    n = len(done)
    finished = str(n) if n == row["draws"] else f"{n}/{row['draws']}"
    return [row["title"], row["labels"], finished]


def median_cell(values):
    return fmt(float(np.median(values)) if len(values) else None)


def range_cell(values):
    if len(values) > 1:
        return f"{min(values):.2f}-{max(values):.2f}"
    return fmt(values[0] if len(values) else None)


def interval_cell(values):
    interval = median_interval(values)
    return "n/a" if interval is None else f"{interval[0]:.2f}-{interval[1]:.2f}"


TABLE_HEADER = ["Setting", "Labels", "Runs", "Error % (median)"]
TABLE_HEADER += [f"Median {MEDIAN_CONFIDENCE:.0%} CI", "Std", "Min-max", "Paper"]
TABLE_HEADER += ["Fit s (median)"]


def table_cells(rows, runs):
    """The common columns of :data:`TABLE_HEADER`, one list per row."""
    cells = []
    for row in rows:
        done = finished_runs(row, runs)
        errors = [r["test_error_percent"] for r in done]
        seconds = [r["fit_seconds"] for r in done]
        std = fmt(float(np.std(errors, ddof=1)) if len(done) > 1 else None)
        stats = [median_cell(errors), interval_cell(errors), std, range_cell(errors)]
        fit_s = fmt(float(np.median(seconds)), 1) if done else "n/a"
        cells.append([*row_start(row, done), *stats, row["paper"] or "n/a", fit_s])
    return cells


def render_parts(results, title, notes, parts):
    """The rendered tables: a title, notes, one table per part (``parts``:
    ``(part, heading, note, header, cells(rows, runs))``) and the per-run
    table; the headings are rubrics, so that the file can be included in the
    middle of a section. The machines and revisions stay in the JSON (each
    run has its own), which the docs' appendix tabulates: a header holding
    them would change with every rerun and fill the pages with hashes."""
    runs, rows = results["runs"], results["rows"]
    out = [f".. rubric:: {title}", ""]
    out += [f"- {note}" for note in notes] + [""]
    for part, heading, note, header, cells in parts:
        part_rows = [r for r in rows if r["part"] == part]
        if part_rows:
            table = rst_table(header, cells(part_rows, runs))
            out += [f".. rubric:: {heading}", ""] + ([note, ""] if note else [])
            out += [table, ""]
    ok = sorted(
        (r for r in runs.values() if r.get("status") == "ok"), key=lambda r: r["key"]
    )
    if ok:
        header = ["Run (part/setting/labels/draw)", "Error %", "Fit s", "Steps"]
        cells = [
            [r["key"], f"{r['test_error_percent']:.2f}", f"{r['fit_seconds']:.1f}"]
            + [str(r.get("n_iter", ""))]
            for r in ok
        ]
        out += [".. rubric:: Per-run results", "", rst_table(header, cells), ""]
    return "\n".join(out)
