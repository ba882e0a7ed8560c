"""Command line: `fedfrozen run` (one federated run), `fedfrozen methods` (the registered methods)
and `fedfrozen reproduce` (the notebooks).

`fedfrozen run` has one flag per Config field (documented from the field's comment in
fedfrozen/engine/config.py), one per method setting (`--fedsteer-core`, generated from the method's settings
dataclass, grouped by method in --help), plus `--config FILE` (JSON or YAML) and `--out DIR`. Rerunning an
interrupted `fedfrozen run` continues from its last checkpoint (kept every
`--checkpoint-seconds`, default 60) and gives the History of an uninterrupted run.
`fedfrozen reproduce --profile {smoke,cpu,paper} [--only 02,03]` executes the notebooks in
order with papermill into runs/<profile>/ and prints one line per notebook; `fedfrozen report` judges their
verdict tables as one family and renders the figure and the documents' verdict blocks from it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

from . import methods
from .base.io import KERNEL_ARGS, THREADS_ENV, notebooks, project_root
from .engine.config import Config, field_type, settings
from .studies.profiles import PROFILES, REGIMES


def _parse_json(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {text!r} ({e})") from None


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    """One flag per Config field and component setting (config.settings), generated from their declarations and
    annotations (a new field or component setting gets its flag)."""
    for name, meta, default in settings():
        flag = "--" + name.replace("_", "-")
        doc = f"{meta['help']} (default: {default!r})".replace("%", "%%")  # argparse formats help with %
        base, elem, _ = field_type(name)
        if base is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=doc)
        elif base is tuple:  # one value per word: --freeze qk v, --fedslm-ranks 4 8 (no words: the empty tuple)
            p.add_argument(flag, nargs="*", type=elem, default=None, help=doc)
        elif base is dict:
            p.add_argument(flag, type=_parse_json, default=None, help=doc + "; a JSON object")
        else:
            p.add_argument(flag, type=base, default=None, help=doc)


_SETTING = "setting:"  # argparse dest prefix of a method setting's flag


def _setting_classes() -> list:
    """The settings classes of the registered methods that have settings, in registration order (a group each)."""
    return list(dict.fromkeys(c for c in map(methods.settings_class, methods.names()) if c.fields()))


def _add_setting_flags(p: argparse.ArgumentParser) -> None:
    """One flag per method setting, `--{prefix}-{name}` (e.g. --fedsteer-core), generated from the settings
    dataclasses (fedfrozen.methods.settings), grouped by method in --help; they fill Config.method_args."""
    seen: set = set()
    for cls in _setting_classes():
        group = p.add_argument_group(f"settings of {', '.join(methods.methods_with(cls))} (Config.method_args)")
        for spec in methods.settings.spec(cls):
            if spec["flat"] in seen:  # an extended class (FedACT's) repeats its base's settings (FedAdamW's)
                continue
            seen.add(spec["flat"])
            flag = "--" + spec["flat"].replace("_", "-")
            doc = f"{spec['name']}: {spec['help']} (default: {spec['default']!r})".replace("%", "%%")
            base, elem, _ = spec["type"]
            dest, meta = _SETTING + spec["flat"], spec["name"].upper()
            if base is bool:
                group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=doc)
            elif base is tuple:
                group.add_argument(flag, dest=dest, nargs="*", type=elem, default=None, metavar=meta, help=doc)
            else:
                group.add_argument(flag, dest=dest, type=base, default=None, metavar=meta, help=doc)


def _settings_from_args(args: argparse.Namespace, method: str) -> dict:
    """The method settings given as flags, by name; a flag of another method's setting is an error."""
    given = {k[len(_SETTING):]: v for k, v in vars(args).items() if k.startswith(_SETTING) and v is not None}
    own = {flat: name for name, flat in methods.flat_names(methods.settings_class(method)).items()}
    out = {}
    for flat, value in given.items():
        if flat not in own:
            owner = methods.flat_settings()[flat][0]
            raise ValueError(f"--{flat.replace('_', '-')} is a setting of {', '.join(methods.methods_with(owner))}, "
                             f"not of --method {method}")
        out[own[flat]] = value
    return out


def _load_config_file(path: str) -> dict:
    """The Config fields in a JSON or YAML file; a ValueError naming the file for anything else."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--config {path!r}: " + ("is a directory, not a file" if p.is_dir() else "no such file"))
    try:
        text = p.read_text()
        if path.endswith((".yaml", ".yml")):
            import yaml

            values = yaml.safe_load(text) or {}
        else:
            values = json.loads(text)
    except Exception as e:  # noqa: BLE001 - JSON, YAML and decoding errors alike
        kind = "YAML" if path.endswith((".yaml", ".yml")) else "JSON"
        first = str(e).splitlines()[0]
        raise ValueError(f"--config {path!r}: not valid {kind} ({type(e).__name__}: {first})") from None
    if not isinstance(values, dict):
        raise ValueError(f"--config {path!r}: holds a {type(values).__name__}, not a mapping of Config fields")
    return values


def config_from_args(args: argparse.Namespace) -> Config:
    values = _load_config_file(args.config) if args.config else {}
    earlier = sorted(k for k in values if k == "components" or k in methods.flat_settings())
    if earlier:  # a stored config of an earlier version reads as it did; a file written by hand says it once
        verb = "is" if len(earlier) == 1 else "are"
        warnings.warn(f"--config {args.config!r}: {', '.join(earlier)} {verb} an earlier version's spelling; this "
                      f"version writes a component's setting by its name (prox_mu: 0.1) and a method's in method_args",
                      FutureWarning, stacklevel=2)
    for name, _, _ in settings():
        v = getattr(args, name)
        if v is not None:
            values[name] = v
    method = values.get("method", Config.method)
    if method not in methods.names():
        raise ValueError(f"method must be one of {', '.join(methods.names())}; got {method!r}")
    flags = _settings_from_args(args, method)
    if flags:
        values["method_args"] = {**(values.get("method_args") or {}), **flags}
    return Config.from_dict(values)


def _methods_table() -> str:
    width = max(map(len, methods.names()))
    def settings(name):
        fields = methods.settings_class(name).fields()
        return f" [settings: {', '.join(fields)}]" if fields else ""

    return "\n".join(f"  {name:{width}s}  {summary}" + settings(name)
                     for name, summary in methods.describe().items())


def _settings_table(name: str) -> str:
    specs = methods.settings.spec(methods.settings_class(name))
    if not specs:
        return f"method {name!r} has no settings of its own"
    lines = [f"settings of {name!r} (Config(method={name!r}, method_args={{...}}); fedfrozen run --method {name} ...):"]
    for sp in specs:
        lines.append(f"  {sp['name']:14s} --{sp['flat'].replace('_', '-'):26s} default {sp['default']!r}: {sp['help']}")
    return "\n".join(lines)


def _components_table() -> str:
    """The components' settings (fedfrozen.methods.settings.component): flat name, flag, default, help."""
    lines = ["settings of the components (Config(prox_mu=0.1), fedfrozen run --prox-mu 0.1; used by the methods whose "
             "components read them):"]
    for flat, (_, f) in methods.component_settings().items():
        lines.append(f"  {flat:20s} --{flat.replace('_', '-'):22s} default {f.default!r}: {f.metadata['help']}")
    return "\n".join(lines)


def cmd_methods(args) -> int:
    if args.settings:
        if args.settings not in methods.names():
            raise ValueError(f"--settings: method must be one of {', '.join(methods.names())}; got {args.settings!r}")
        print(_settings_table(args.settings))
        return 0
    print("registered methods (Config.method / fedfrozen run --method NAME; their settings: --settings NAME):")
    print(_methods_table())
    print(_components_table())
    return 0


def _out(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must name a folder (got an empty string)")
    return value


def _threads(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {n}")
    return n


def cmd_run(args) -> int:
    from .runs.experiments import config_key, run_or_load

    cfg = config_from_args(args)
    t0 = time.perf_counter()
    hist = run_or_load(cfg, root=args.out, experiment="cli", force=args.force, progress=not args.quiet,
                       checkpoint_seconds=args.checkpoint_seconds, wait=not args.no_wait)
    acc = hist.final_accuracy
    status = "DIVERGED at round {round}, client {client}".format(**hist.diverged) if hist.diverged else "ok"
    print(f"fedfrozen run: method={cfg.method} dataset={cfg.dataset} partition={cfg.partition} "
          f"rounds={len(hist)} final_test_acc={'n/a' if acc is None else f'{acc:.4f}'} "
          f"{'(cached) ' if hist.cached else ''}{'(resumed) ' if hist.resumed_from else ''}status={status} "
          f"seconds={time.perf_counter() - t0:.1f} "
          f"out={os.path.join(args.out, 'cli', config_key(cfg))}")
    return 1 if hist.diverged else 0


def headline(nb) -> str:
    """The last line a notebook printed that starts with 'headline: ' (each notebook prints its
    main result that way in its checks cell), without the prefix; '' if there is none."""
    found = ""
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                for line in out.get("text", "").splitlines():
                    if line.startswith("headline: "):
                        found = line[len("headline: "):].strip()
    return found


def cmd_reproduce(args) -> int:
    import papermill as pm

    root = project_root()
    books = notebooks(args.only)  # an unknown --only fails here, before anything is created
    out_dir = root / "runs" / args.profile
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ["FEDFROZEN_PROFILE"] = args.profile
    if args.ray:
        from .runs.cluster import ADDRESS_ENV, check_address

        check_address(args.ray)  # one clear line now, not one per notebook
        os.environ[ADDRESS_ENV] = args.ray
    rows, failed = [], 0
    for nb in books:
        t0 = time.perf_counter()
        try:
            done = pm.execute_notebook(str(nb), str(out_dir / nb.name), parameters={"profile": args.profile},
                                       cwd=str(nb.parent), kernel_name=args.kernel, progress_bar=False,
                                       extra_arguments=KERNEL_ARGS)
            status, result = "ok", headline(done)
        except Exception as e:  # papermill raises PapermillExecutionError with the cell's error
            status = "FAILED"
            result = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:160] if str(e).strip() else ''}"
            failed += 1
        seconds = time.perf_counter() - t0
        rows.append((nb.name, status, seconds, result))
        print(f"{nb.name:40s} {status:6s} {seconds:8.1f} s   {result}", flush=True)
    total = sum(r[2] for r in rows)
    print(f"\n{'notebook':40s} {'status':6s} {'seconds':>10s}   headline (or error)")
    for name, status, seconds, result in rows:
        print(f"{name:40s} {status:6s} {seconds:10.1f}   {result}")
    print(f"{len(rows)} notebooks, {len(rows) - failed} ok, {failed} failed, {total:.1f} s in all "
          f"(profile {args.profile}; executed copies in {out_dir.relative_to(root)}/)")
    return 1 if failed else 0


def cmd_dry_run(args) -> int:
    from .runs.dryrun import HEADER, dry_run, format_table

    print(HEADER, flush=True)
    rows = dry_run(args.profile, tiny=args.tiny, rounds=args.rounds, only=args.only, kernel=args.kernel, keep=args.keep,
                   progress=lambda line: print(line, flush=True), workers=args.workers)
    print()
    print(format_table(rows))
    return 1 if any(r["status"] != "ok" for r in rows) else 0


def cmd_verify(args) -> int:
    from .base.io import follow_threads
    from .studies.verification import DEFAULT_RUNS, format_report, plan, verify

    follow_threads()  # one thread unless --threads/FEDFROZEN_THREADS: the runs' floats depend on the count
    runs = args.runs if args.runs is not None else DEFAULT_RUNS
    p = plan(args.only, runs=runs, seeds=args.seeds)
    print(f"notebook {args.only}: retraining {len(p.configs)} committed runs ({p.cost:.1f} one-epoch runs of work) "
          f"for {len(p.verdicts)} comparisons on seeds {p.seeds}; cached under {args.out or 'results/'} "
          f"(an interrupted verify continues)", flush=True)
    report = verify(args.only, runs=runs, seeds=args.seeds, root=args.out, workers=args.workers,
                    progress=not args.quiet)
    print(format_report(report))
    return 0 if report.ok else 1


def cmd_select_lr(args) -> int:
    from .studies.profiles import PAPER_LR_GRID, paper_lr_file
    from .studies.selection import select_learning_rates

    overrides = _load_config_file(args.config) if args.config else None
    if args.regime and args.profile != "cpu":
        raise ValueError("--regime is a setting of the cpu profile's selection (--profile cpu)")
    if args.profile == "cpu":
        return _select_lr_cpu(args, overrides)
    result = select_learning_rates(args.methods or methods.names(), dataset=args.dataset,
                                   grid=args.grid or PAPER_LR_GRID, rounds=args.rounds or 30, root=args.out,
                                   overrides=overrides)
    for m, lr in result["lr"].items():
        accs = ", ".join(f"{k}: {'n/a' if v is None else f'{v:.3f}'}" for k, v in result["val_acc"][m].items())
        print(f"{m:24s} lr {lr:g}   (validation accuracy {accs})")
    print(f"written to {paper_lr_file(args.dataset, args.out)}; the paper profile reads it")
    return 0


def _select_lr_cpu(args, overrides: dict | None) -> int:
    """The cpu profile's selection (Fashion-MNIST; a regime of notebooks 03-06 with --regime): AdamW arms on
    CPU_LR_GRID (a regime's on REGIME_LR_GRID), each `<method>:sgd` arm (the method with plain SGD, as its authors ran
    it) on CPU_SGD_LR_GRID, by the one rule; printed, for profiles.CPU_LR (or REGIME_LR) with its accuracies."""
    from .studies import profiles
    from .studies.selection import select_learning_rates

    arms = args.methods or profiles.CPU_SELECTED_ARMS
    base = profiles.federated("cpu")
    if args.regime:
        base = {**base, **profiles.regime_fields(args.regime)}
    base = {**base, **(overrides or {})}
    for optimizer in ("adamw", "sgd"):
        chosen = [a.split(":")[0] for a in arms if a.endswith(":sgd") == (optimizer == "sgd")]
        if not chosen:
            continue
        fields = dict(base, **(profiles.SGD_AS_PUBLISHED if optimizer == "sgd" else {}))
        grid = args.grid or (profiles.CPU_SGD_LR_GRID if optimizer == "sgd" else
                             profiles.REGIME_LR_GRID if args.regime else profiles.CPU_LR_GRID)
        result = select_learning_rates(chosen, grid=grid, rounds=args.rounds or base["rounds"], root=args.out,
                                       base=fields)
        for m in chosen:
            name = f"{m}:sgd" if optimizer == "sgd" else m
            accs = " ".join(f"{float(k):g}: " + ("diverged" if v is None else f"{v:.3f}")
                            for k, v in sorted(result["val_acc"][m].items(), key=lambda t: float(t[0])))
            print(f"{args.regime or 'cpu'} {name:18s} -> {result['lr'][m]:g}   (late val acc {accs})", flush=True)
    print("not written anywhere: the cpu profile's rates are profiles.CPU_LR and REGIME_LR, with these accuracies")
    return 0


def cmd_archive(args) -> int:
    from .runs.archive import configs_of, finished, held, pack, unpack

    if args.action == "pack":
        if not args.configs and not args.experiment:
            raise ValueError("archive pack: give --configs (a notebook's figures/NN_configs.jsonl, one or more) or "
                             "--experiment (every finished run of it)")
        entries = [e for path in args.configs or () for e in configs_of(path)]
        entries += [e for name in args.experiment or () for e in finished(name, root=args.out)]
        skipped = {e for path in args.skip or () for e in held(path)}
        new = [e for e in entries if e not in skipped]
        if entries and not new:
            raise ValueError(f"archive pack: every one of the {len(set(entries))} runs is already in the --skip "
                             f"archives: nothing new to pack")
        done = pack(args.file, new, root=args.out)
        left_out = len(set(entries)) - done["entries"]
        print(f"{args.file}: {done['entries']} runs, {done['bytes'] / 1024:.0f} KiB"
              + (f" ({left_out} left out: already in --skip archives)" if args.skip else ""))
        return 0
    for path in args.file_list:
        report = unpack(path, root=args.out)
        print(f"{path}: {len(report['added'])} runs added, {len(report['present'])} already cached, "
              f"{len(report['differs'])} cached with another History (kept: {', '.join(report['differs']) or 'none'})")
    return 0


def cmd_budget(args) -> int:
    from .runs.timing import measure

    books = notebooks(args.only)  # an unknown --only fails here, before anything runs
    measure(books, args.workers, print_row=lambda line: print(line, flush=True))
    return 0


def cmd_report(args) -> int:
    from .studies.report import write

    write(args.profile)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedfrozen", description=__doc__.splitlines()[0])
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    p.add_argument("--threads", type=_threads, default=None,
                   help="CPU threads for torch in every run (sets FEDFROZEN_THREADS; default: FEDFROZEN_THREADS "
                        "if set, else 1, which on small models is as fast idle and much faster on a busy machine: "
                        "README)")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="one federated run (flags mirror fedfrozen.Config)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="methods (--method NAME):\n" + _methods_table())
    r.add_argument("--config", help="JSON or YAML file of Config fields; flags override it")
    r.add_argument("--out", default="results", type=_out, help="results root; the run goes to OUT/cli/<config hash>/")
    r.add_argument("--no-wait", action="store_true",
                   help="if another process is training this config, exit instead of waiting for its result")
    r.add_argument("--force", action="store_true", help="train again even if a cached result exists")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--checkpoint-seconds", type=float, default=60.0,
                   help="keep a checkpoint of the unfinished run at most this often (0: every round); "
                        "rerunning the same command after an interruption continues from it (default: 60)")
    _add_config_flags(r)
    _add_setting_flags(r)
    r.set_defaults(func=cmd_run)
    m = sub.add_parser("methods", help="list the registered methods, one line each")
    m.add_argument("--settings", metavar="NAME", help="the settings of method NAME: names, flags, defaults, help")
    m.set_defaults(func=cmd_methods)
    d = sub.add_parser("dry-run", help="every paper-profile config of every notebook for a few rounds on a fake "
                                       "CIFAR: configs, seconds per round, peak memory, projected hours")
    d.add_argument("--profile", choices=["paper"], default="paper", help="the profile to check")
    d.add_argument("--tiny", action="store_true", help="a tiny model and one seed per config (proves the paths run; "
                                                      "the projection is then meaningless)")
    d.add_argument("--rounds", type=int, default=2, help="rounds per config (>= 2: both stages)")
    d.add_argument("--only", help="comma-separated notebook numbers, e.g. 03,04")
    d.add_argument("--kernel", default="python3", help="Jupyter kernel name")
    d.add_argument("--keep", help="keep the temporary project (executed notebooks, log) in this folder")
    d.add_argument("--workers", type=_threads, default=1,
                   help="notebooks executed at once (default 1; more share the cores, so the projection is then off)")
    d.set_defaults(func=cmd_dry_run)
    v = sub.add_parser("verify", help="retrain a sample of a notebook's committed runs on this machine and check that "
                                      "its paired verdicts agree (docs/claims.md: reproducing on your machine)")
    v.add_argument("--only", default="04", help="the notebook whose committed runs to check (default 04: C1 and C2), "
                                                   "or one of its tables (03_controls: the controlled cells)")
    v.add_argument("--runs", type=float, default=None,
                   help="the most work to retrain, in one-epoch 120-round runs (default 16: about 11 minutes on 2 "
                        "cores for notebook 04)")
    v.add_argument("--seeds", type=int, default=3, help="seeds per comparison (the first ones both arms have; "
                                                       "default 3)")
    v.add_argument("--workers", type=_threads, default=2, help="runs trained at once (default 2)")
    v.add_argument("--out", default=None, type=_out, help="results root (default: the project's results/)")
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    v.set_defaults(func=cmd_verify)
    s = sub.add_parser("select-lr", help="choose each method's local lr by the one rule, at the paper scale "
                                         "(written where the paper profile reads it) or the cpu profile's (printed)")
    s.add_argument("--profile", choices=["paper", "cpu"], default="paper",
                   help="paper (CIFAR, default) or cpu (Fashion-MNIST: the rates of profiles.CPU_LR and REGIME_LR)")
    s.add_argument("--dataset", choices=["cifar10", "cifar100"], default="cifar10", help="the paper profile's dataset")
    s.add_argument("--regime", default=None, choices=sorted(REGIMES),
                   help="cpu profile: a regime of notebooks 03-06, selected on REGIME_LR_GRID")
    s.add_argument("--methods", nargs="+", help="methods to select for (default: every registered method; at the "
                                                "cpu profile the paper notebooks' arms, `<method>:sgd` for plain SGD)")
    s.add_argument("--grid", nargs="+", type=float, default=None,
                   help="learning rates to try (default: the profile's grid)")
    s.add_argument("--rounds", type=int, default=None, help="rounds per selection run (default: 30 at the paper "
                                                            "profile, the profile's own at cpu)")
    s.add_argument("--out", default=None, type=_out, help="results root (default: the project's results/)")
    s.add_argument("--config", help="JSON or YAML file of Config fields that change the paper profile's settings")
    s.set_defaults(func=cmd_select_lr)
    a = sub.add_parser("archive", help="pack finished cached runs into one file, or unpack one into the cache (a grid "
                                       "that goes on on another machine: fedfrozen/runs/archive.py)")
    a_sub = a.add_subparsers(dest="action", required=True)
    ap = a_sub.add_parser("pack", help="write the cached runs of notebooks' configs files to FILE (.tar.xz)")
    ap.add_argument("file", help="the archive to write")
    ap.add_argument("--configs", nargs="+", help="figures/NN_configs.jsonl files: the runs to pack")
    ap.add_argument("--experiment", nargs="+", help="experiments (results/NAME) whose every finished run to pack: an "
                                                   "unfinished grid so far")
    ap.add_argument("--skip", nargs="+", metavar="ARCHIVE", help="archives whose runs to leave out (earlier batches "
                                                                "of the same grid)")
    ap.add_argument("--out", default=None, type=_out, help="results root (default: the project's results/)")
    au = a_sub.add_parser("unpack", help="put the runs of archives into the cache, checked, where it has none")
    au.add_argument("file_list", nargs="+", metavar="FILE", help="archives written by `fedfrozen archive pack`")
    au.add_argument("--out", default=None, type=_out, help="results root (default: the project's results/)")
    a.set_defaults(func=cmd_archive)
    q = sub.add_parser("reproduce", help="execute the notebooks with papermill")
    q.add_argument("--profile", choices=PROFILES, default="cpu", help="smoke (CI), cpu (default), paper (GPU)")
    q.add_argument("--only", help="comma-separated notebook numbers, e.g. 02,03")
    q.add_argument("--kernel", default="python3", help="Jupyter kernel name")
    q.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="run every notebook's grid on the Ray cluster at ADDRESS (auto, host:port; 'local' starts "
                        "one on this machine): sets FEDFROZEN_RAY_ADDRESS for the kernels (docs/cluster.md)")
    q.set_defaults(func=cmd_reproduce)
    b = sub.add_parser("budget", help="time the notebooks from an empty cache on this machine: execute each at the "
                                      "cpu profile with its runs logged (outputs not written back), each run counted "
                                      "once, as recorded and at the idle machine's rates (docs/cpu_profile.md, Time)")
    b.add_argument("--only", help="comma-separated notebook numbers, e.g. 03,04 (the earlier ones' runs still count "
                                  "as made)")
    b.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="runs trained at a time (default: cores)")
    b.set_defaults(func=cmd_budget)
    rp = sub.add_parser("report", help="judge the claim notebooks' verdict tables as one family: write "
                                       "figures/readme_verdicts.csv, the headline figure and (cpu profile) the verdict "
                                       "blocks of README.md and docs/claims.md")
    rp.add_argument("--profile", choices=PROFILES, default="cpu",
                    help="read runs/<profile>/figures (smoke, paper) or figures/ (cpu, default; also the documents)")
    rp.set_defaults(func=cmd_report)
    return p


def main(argv=None) -> int:
    """Run a subcommand; any error is one line `fedfrozen: error: ...` and exit status 2 (1 for a failed run)
    unless --debug, which shows the traceback. --threads N sets FEDFROZEN_THREADS, which every run reads."""
    args = build_parser().parse_args(argv)
    # read by every run, here and in the notebook kernels `reproduce` starts; 1 unless said otherwise (README:
    # on the 2-core machine a second thread gains nothing idle and costs 2.4x when other work runs)
    if args.threads is not None or not os.environ.get(THREADS_ENV):
        os.environ[THREADS_ENV] = str(args.threads or 1)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("fedfrozen: interrupted (a rerun of the same command continues from the last checkpoint)",
              file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every error reaches the user as one line
        if args.debug:
            raise
        print(f"fedfrozen: error: {e}" if isinstance(e, (ValueError, TypeError, FileNotFoundError))
              else f"fedfrozen: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
