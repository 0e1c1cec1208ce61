"""`gpt-ft suite`: fine-tune and evaluate many task cards over seeds, in one resumable run.

A suite file (configs/suites/*.yaml) lists task cards, the fit config and arguments they share,
the seeds, the GPT-1 paper's values, the benchmark score to report and the submission's files.
Every task x seed (x transferred layers) is one `gpt-ft fit` run in this process (in each, under
DDP), built from the configuration its arguments resolve to; its metrics and that configuration go
to OUT/runs/TASK/.../result.json, written last: a rerun redoes the rest and the changed. OUT holds:

- results.json: per task, per metric, every seed's value, mean and std; the configuration used;
- results.md:   task, metric, mean ± std, zero-shot, the paper's value, and the benchmark score;
- results.png:  our scores beside the paper's; transfer.png when transferred layers are swept;
- the submission folder and archive (GLUE: CoLA.tsv ... AX.tsv zipped), from each task's best seed.

Scores are in percent (GLUE's convention): the paper's on test sets, ours on validation splits
(a sweep of transferred layers: its deepest in the main table).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import yaml

from gpt_ft.adapters.cards import load_card
from gpt_ft.data.files import examples_split, labelled_rows
from gpt_ft.data.folders import first_process, held
from gpt_ft.errors import check_output_dir
from gpt_ft.eval import suite_file, zeroshot
from gpt_ft.eval.curves import MISSING, baseline_curves, collect_curves, labels_saved, read_baselines
from gpt_ft.eval.finetune import check_run, config_changes, fit_and_evaluate, main_key, resolved
from gpt_ft.eval.progress import say
from gpt_ft.eval.results import (
    benchmark_score,
    changed_files,
    input_stamps,
    mean_std,
    minutes,
    percent,
    run_stamps,
    seeds_stats,
    write_results,
)
from gpt_ft.eval.suite_file import Run, SuiteSpec, as_list, check_paper, data_dirs, load_suite
from gpt_ft.eval.suite_folder import (
    check_out_dir,
    gather_submission,
    put_back,
    read_json,
    set_aside,
    write_json,
)
from gpt_ft.training.callbacks import finite
from gpt_ft.training.runs import build_fit
from gpt_ft.training.stop_signals import stop_if_unheeded
from gpt_ft.weights.pretrained import resolve_tokenizer

RESULT = "result.json"


class SuiteRunner:
    """Fine-tune and evaluate a suite's tasks over seeds: a results table, chart and submission."""

    def __init__(
        self,
        suite: str,
        *,
        out_dir: str,
        init_from: str | None = None,
        tokenizer: str | None = None,
        data_dir: list[str] | str = (),
        tasks: list[str] | str | None = None,
        seeds: list[int] | None = None,
        select: Literal["last", "best"] = "last",
        fine_tune: bool = True,
        zero_shot: bool = False,
        transfer_layers: list[int] = (),
        predict: bool | None = None,
        keep_checkpoints: bool = False,
        train_sizes: list[int | Literal["all"]] | None = None,
        baselines: list[str] | str = (),
        fit_args: list[str | int | float | bool] | str = (),
    ) -> None:
        """Fine-tune and evaluate a suite's tasks over seeds; --fit_args go to every `gpt-ft fit`.

        Args:
            suite: Suite file, e.g. configs/suites/glue.yaml (or a SuiteSpec already read).
            out_dir: Results folder; rerunning resumes it.
            init_from: Pretrained weights; default: from scratch.
            tokenizer: Default: the one saved with --init_from.
            data_dir: Tasks' local files: DIR for all, TASK=DIR for one, or a list of both
                (`[~/glue, storycloze=~/storycloze]`).
            tasks: Run only these of its tasks (one, or a list).
            seeds: A list (`[0, 1, 2]`); default: the suite file's.
            select: Report the last epoch or the best one.
            fine_tune: false: zero-shot only.
            zero_shot: Also score the tasks zero-shot.
            transfer_layers: Sweep the pretrained layers transferred (e.g. `[0, 3, 6, 12]`), GPT-1
                Fig. 2 left.
            predict: Write test predictions; default: if the suite has a submission (a sweep: no).
            keep_checkpoints: Keep every run's checkpoints.
            train_sizes: Learning curves: training examples per run (stratified subsets, e.g. `[100,
                300, 1000, all]`); default: the suite file's.
            baselines: Learning curves measured elsewhere on the same subsets, drawn beside the rows:
                a JSON file or a list (benchmarks/tfidf_baseline.py --train-sizes ... --json FILE writes one).
            fit_args: Every `gpt-ft fit`'s extra arguments: a list (`[--trainer.max_epochs, 2]`) or one text.
        """
        out = check_output_dir(out_dir, "--out_dir")
        spec = suite if isinstance(suite, SuiteSpec) else load_suite(suite)
        self.source = f"suite {spec.name!r}" if isinstance(suite, SuiteSpec) else f"Suite file {suite}"
        data_dir, tasks, baselines = as_list(data_dir), as_list(tasks) or None, as_list(baselines)
        self.spec, self.baselines = spec, read_baselines(baselines or [], list(spec.rows or []))
        sizes = train_sizes if train_sizes is not None else spec.train_sizes
        self.sizes: list[int | None] = [None if s == "all" else int(s) for s in sizes or ["all"]]
        self.rows: list[str | None] = list(spec.rows or [None])
        local = suite_file.absolute  # a result records them: a rerun from another folder reads the same
        self.out, self.init_from, self.tokenizer = out, local(init_from), local(tokenizer)
        if tokenizer is None and init_from and spec.rows:  # a row may drop --init_from: fixed at the start
            self.tokenizer = resolve_tokenizer(None, self.init_from)
        self.data_dirs = data_dirs(data_dir or [])
        self.seeds = list(seeds if seeds is not None else spec.seeds)
        given = "--seeds" if seeds is not None else f"{self.source}: seeds"
        seeds_ok = len(set(self.seeds)) == len(self.seeds) and all(0 <= s < 2**32 for s in self.seeds)
        if (fine_tune and not self.seeds) or not seeds_ok:  # (numpy's seeds, which fit's refuses)
            raise ValueError(f"{given} {self.seeds}: give one or more seeds in [0, {2**32 - 1}], each once.")
        args = [suite_file.arg_text(a) for a in fit_args or []] if not isinstance(fit_args, str) else None
        self.fit_args = shlex.split(fit_args) if args is None else args
        self.select, self.fine_tune, self.zero_shot = select, fine_tune, zero_shot
        self.transfer_layers = list(transfer_layers or [])
        suite_file.check_sweeps(self.sizes, self.transfer_layers, init_from)
        if (zero_shot or self.transfer_layers) and not init_from:
            raise ValueError("--zero_shot and --transfer_layers need pretrained weights: give --init_from.")
        if not fine_tune and not zero_shot:
            raise ValueError("Nothing to do: --fine_tune false needs --zero_shot true.")
        default = spec.submission is not None and not transfer_layers  # (a depth sweep's: none unless asked)
        self.predict, self.keep_checkpoints = default if predict is None else predict, keep_checkpoints
        submits = self.predict and fine_tune and spec.submission is not None
        check_out_dir(self.out, submits, spec.submission.archive if submits else None)
        # The main table and the submission: the runs of every layer transferred, or a sweep's deepest.
        self.main_layers = max(self.transfer_layers) if self.transfer_layers else None
        self.main_size = None if None in self.sizes else max(self.sizes)  # all, or the largest subset
        self.cards = {}
        for entry in spec.tasks:
            task = load_card(entry.card)
            if task.name in self.cards:
                raise ValueError(f"{self.source} lists task {task.name!r} twice ({entry.card} is one).")
            self.cards[task.name] = (entry, check_paper(self.source, entry, task))
            if zero_shot and entry.zero_shot and task.name in (tasks or [task.name]):  # what will run
                zeroshot.check_method(task, entry.zero_shot, self.source)
        score = spec.score.tasks if spec.score else []  # a score no run could complete, a DIR never read
        for names, where in ((score, f"{self.source}: its score"), (self.data_dirs, "--data_dir")):
            if unknown := set(names) - {None, *self.cards}:
                raise ValueError(f"{where} names task(s) {sorted(unknown)} not in suite {spec.name!r}.")
        self.all_cards = self.cards  # a `--tasks` subset still reports earlier runs of the others
        self.resolved: dict[str, dict[str, Any]] = {}  # each run's configuration, by folder
        if tasks:
            if unknown := [t for t in tasks if t not in self.cards]:
                raise ValueError(f"--tasks {unknown}: suite {spec.name!r} has {sorted(self.cards)}.")
            self.cards = {name: self.cards[name] for name in tasks}
        suite_file.check_files(self.cards, self.data_dirs, fine_tune)

    # ---- the runs ----

    def runs(self) -> list[Run]:
        layers = self.transfer_layers or [None]
        return [Run(name, seed, k, row, size) for row in self.rows for name in self.cards for k in layers
                for size in self.sizes for seed in self.seeds]  # fmt: skip

    def run(self, log=say) -> dict[str, Any]:
        with held(self.out if first_process() else None, "`gpt-ft suite`"):  # another there: refused
            return self._run(log)

    def _run(self, log) -> dict[str, Any]:
        start, writes = time.perf_counter(), first_process()  # the others of a DDP run fit, silent
        log = log if writes else (lambda *args, **kwargs: None)
        if self.zero_shot and writes:
            for name, (entry, task) in self.cards.items():
                if entry.zero_shot is None and not task.choices_in_examples:
                    log(f"zero-shot: {name} has no method (a `zero_shot` entry in the suite file): skipped")
                    continue
                self._zero_shot(name, log)
        runs = self.runs() if self.fine_tune else []
        alone = writes and os.environ.get("WORLD_SIZE", "1") == "1"  # no other rank reads a folder moved;
        for previous in sorted((self.out / "runs").rglob("*.previous")) if alone else []:  # every task's
            put_back(previous.with_suffix(""), RESULT)  # (in --tasks or not: each is in the report)
        todo = [r for r in runs if self._result(r, log) is None]
        for run in {(r.task, r.row): r for r in todo}.values():  # a bad argument stops it before it trains
            self._resolve(run)
        if runs:
            done, n = len(runs) - len(todo), len(runs)
            log(f"suite {self.spec.name}: {n} run{'s' * (n != 1)}, {done} finished before, {len(todo)} to go")
        took: list[float] = []
        for i, run in enumerate(todo, 1):
            left = f", about {minutes(statistics.fmean(took) * (len(todo) - i + 1))} left" if took else ""
            log(f"[{i}/{len(todo)}] {run}{left}")
            t = time.perf_counter()
            self.fit(run, log)
            took.append(time.perf_counter() - t)
        results = self.collect(log)
        if writes:
            write_results(self.out, results)
        if writes and self.predict and self.spec.submission is not None and self.fine_tune:
            self.write_submission(results, log)
        spent = minutes(time.perf_counter() - start)
        log(f"suite {self.spec.name}: done in {spent}; see {self.out / 'results.md'}")
        return results

    def fit_args_of(self, run: Run, own: bool = False) -> list[str]:  # (own: without --fit_args)
        entry, _ = self.all_cards[run.task]
        folder = self.out / "runs" / run.folder
        data = {"task": str(entry.card), "tokenizer": self.tokenizer, "train_size": run.size,
                "data_dir": self.data_dirs.get(run.task, self.data_dirs.get(None))}  # fmt: skip
        # One --data mapping, not an option each: a parse checks the data module, its card with it,
        # at every --data.KEY.
        data = {key: str(value) if isinstance(value, Path) else value for key, value in data.items() if value}
        args = ["--config", self.spec.config] if self.spec.config else []
        args += [f"--data={json.dumps(data)}", f"--seed_everything={run.seed}"]
        if self.init_from:
            args.append(f"--model.init_from={self.init_from}")
        if run.layers is not None:
            args.append(f"--model.transfer_layers={run.layers}")
        args += [
            f"--trainer.default_root_dir={folder}",
            f"--trainer.logger.init_args.save_dir={folder}",
            f"--model.predictions_dir={folder / 'predictions'}",
        ]
        row = self.spec.rows[run.row] if run.row is not None else []
        return args + self.spec.args + entry.args + row + self.fit_args * (not own)

    def _resolve(self, run: Run) -> dict[str, Any]:
        """The configuration the run's `gpt-ft fit` arguments resolve to (`FitRuns.resolve`), once."""
        if run.folder not in self.resolved:
            where = f"{self.source}, task {run.task!r}" + (f", row {run.row!r}" if run.row else "")
            parts = self.fit_args_of(run, own=True), self.fit_args, self._min_steps(run)
            config = resolved(build_fit, parts, where)
            self.resolved[run.folder] = check_run(config, run, self.out / "runs" / run.folder, where)
        return self.resolved[run.folder]

    def _min_steps(self, run: Run) -> list[str]:
        """The option `fit_and_evaluate` adds to a run on a training subset (`min_steps`)."""
        subset = run.size is not None and self.spec.min_steps
        return [f"--trainer.min_steps={self.spec.min_steps}"] if subset else []

    def _result(self, run: Run, log=None, then: str = "running it again") -> dict[str, Any] | None:
        """The run's result, if it is on disk and came from the configuration its arguments give now;
        else None (`log` says what changed, and `then`)."""
        result = read_json(self.out / "runs" / run.folder / RESULT)
        if result is None:
            return None
        config = self._resolve(run)
        changed = config_changes(result, config, build_fit, self._min_steps(run))
        if result.get("select", self.select) != self.select:  # (a result from before it was recorded: kept)
            changed.append(f"--select {self.select}")
        if self.predict and result.get("predict") is False:
            changed.append("--predict true")
        changed += changed_files(result.get("files"), run_stamps(self.all_cards[run.task][1], config))
        if changed and log is not None:
            log(f"{run}: its inputs changed since it ran ({', '.join(changed)}): {then}")
        return None if changed else result

    def fit(self, run: Run, log=say) -> dict[str, Any]:
        """One fine-tuning run: fit, the chosen epoch's validation metrics, test predictions."""
        folder = self.out / "runs" / run.folder
        with set_aside(folder if first_process() else None, RESULT):  # a failed rerun keeps the last
            folder.mkdir(parents=True, exist_ok=True)
            start, args = time.perf_counter(), self.fit_args_of(run)
            config = self._resolve(run)  # recorded, compared by a rerun
            min_steps = self.spec.min_steps if run.size is not None else None
            metrics, epoch = fit_and_evaluate(
                build_fit, args, self.select, predict=self.predict, log=log, min_steps=min_steps
            )
            for ckpt in folder.rglob("*.ckpt") if not self.keep_checkpoints and first_process() else []:
                ckpt.unlink()
            result = {"task": run.task, "seed": run.seed, "layers": run.layers, "row": run.row,
                      "size": run.size}  # fmt: skip
            result |= {"epoch": epoch, "metrics": metrics, "seconds": round(time.perf_counter() - start, 1)}
            result |= {"config": config, "select": self.select, "predict": bool(self.predict)}
            result["files"] = run_stamps(self.cards[run.task][1], config)
            if first_process():
                write_json(folder / RESULT, result)
        stop_if_unheeded(f"{run} finished: the same gpt-ft suite command goes on with the rest")
        return result

    def _zero_shot_inputs(self, name: str) -> dict[str, Any]:
        """What a task's zero-shot score comes from: a score from other inputs is not this suite's."""
        entry, task = self.all_cards[name]
        data_dir = self.data_dirs.get(name, self.data_dirs.get(None))
        inputs = {k: str(v) for k, v in (("init_from", self.init_from), ("tokenizer", self.tokenizer),
                                         ("data_dir", data_dir), ("method", entry.zero_shot))}  # fmt: skip
        inputs["files"] = input_stamps(task, data_dir, self.tokenizer, self.init_from)
        inputs["card"] = yaml.safe_load(Path(entry.card).read_text("utf-8"))  # what it says, not its layout
        return inputs

    def _zero_shot(self, name: str, log) -> None:
        path, inputs = self.out / "runs" / name / "zero-shot" / RESULT, self._zero_shot_inputs(name)
        done = read_json(path)
        if done is not None and done.get("inputs", inputs) == inputs:  # (one from before inputs were kept)
            return
        if done is not None:
            log(f"zero-shot {name}: its model, data or method changed since it ran: scoring it again")
        log(f"zero-shot {name}")
        entry, task = self.cards[name]
        data_dir, start = self.data_dirs.get(name, self.data_dirs.get(None)), time.perf_counter()
        metrics = zeroshot.score(
            task, self.init_from, self.tokenizer, lambda split: labelled_rows(task, split, data_dir),
            entry.zero_shot, name,
        )  # fmt: skip
        metrics = {k: finite(v) for k, v in metrics.items()}
        seconds = round(time.perf_counter() - start, 1)
        write_json(path, {"task": name, "metrics": metrics, "seconds": seconds, "inputs": inputs})

    # ---- results ----

    def collect(self, log=say) -> dict[str, Any]:
        """Every finished run's metrics in the results (percent): this invocation's tasks and earlier
        ones' (`--tasks` subsets), where they came from what the suite gives now (else said)."""
        stale, tasks = "left out of the results (run it again, or give what it ran with)", {}
        for name, (entry, task) in self.all_cards.items():
            folders = {Path(Run(name, 0, row=row).folder).parent for row in self.rows} | {Path(name)}
            if name not in self.cards and not any(
                any((self.out / "runs" / f).glob(f"**/{RESULT}")) for f in folders
            ):
                continue  # an earlier invocation's task (`--tasks`), under any row's folder
            item: dict[str, Any] = {"card": entry.card, "main_metric": main_key(task), "metrics": {}}
            rows = item["metrics"]
            for seed in self.seeds:  # a zero-shot pass keeps the fine-tuned results of what it gives
                run = self._table_run(name, seed)
                said = name in self.cards and self.fine_tune  # (`run` said it, and ran it again)
                result = self._result(run, None if said else log, stale)
                for key, value in (result or {}).get("metrics", {}).items():
                    if key.split("/")[-1] in task.metrics:  # the benchmark's metrics, not the loss
                        rows.setdefault(key, {"seeds": {}})["seeds"][str(seed)] = percent(value, key)
            for stats in rows.values():
                stats.update(mean_std(list(stats["seeds"].values())))
            zero = read_json(self.out / "runs" / name / "zero-shot" / RESULT)
            if zero is not None and zero.get("inputs", inputs := self._zero_shot_inputs(name)) != inputs:
                log(f"zero-shot {name}: scored from other weights, data or method than given now: {stale}")
                zero = None
            for key, value in (zero or {}).get("metrics", {}).items():
                rows.setdefault(key, {"seeds": {}})["zero_shot"] = percent(value, key)
            for key, value in entry.paper.items():
                full = key if "/" in key else f"{task.validation_splits[0]}/{key}"
                rows.setdefault(full, {"seeds": {}})["paper"] = value
            m, first = item["main_metric"], self.rows[0]
            if self.transfer_layers:
                item["transfer"] = {str(k): self._main_stats(name, m, k, first) for k in self.transfer_layers}
            if len(self.rows) > 1 and self.sizes == [None]:  # (with sizes: each row's curve)
                item["by_row"] = {row: self._main_stats(name, m, self.main_layers, row) for row in self.rows}
            if self.sizes != [None]:
                item["curves"] = self._curves(name, item["main_metric"])
                item["labels_saved"] = labels_saved(item["curves"])
            tasks[name] = item
        config = {"suite": asdict(self.spec), "init_from": self.init_from, "tokenizer": self.tokenizer,
                  "data_dir": {k or "*": v for k, v in self.data_dirs.items()}, "seeds": self.seeds,
                  "select": self.select, "fit_args": self.fit_args, "transfer_layers": self.transfer_layers,
                  "rows": self.spec.rows, "train_sizes": ["all" if s is None else s for s in self.sizes],
                  "min_steps": self.spec.min_steps, "fine_tune": self.fine_tune}  # fmt: skip
        results = {"suite": self.spec.name, "config": config, "tasks": tasks}
        if self.spec.score is not None:
            results["score"] = benchmark_score(self.spec.score, tasks)
        return results

    def _curves(self, name: str, metric: str) -> dict[str, Any]:
        """Each row's learning curve of task `name` (`gpt_ft.eval.curves`), then the baselines'."""
        entry, task = self.all_cards[name]

        def score(row: str | None, size: int | None, seed: int) -> float | None:
            result = self._result(Run(name, seed, self.main_layers, row=row, size=size))
            return MISSING if result is None else percent(result["metrics"].get(metric), metric)

        def whole() -> int:  # examples of the training split (not its records), where "all" sits
            return len(examples_split(task, "train", self.data_dirs.get(name, self.data_dirs.get(None))))

        curves = collect_curves(score, self.rows, self.sizes, self.seeds, whole)
        return {**curves, **baseline_curves(self.baselines, name, self.sizes, self.seeds, whole)}

    def write_submission(self, results: dict[str, Any], log=say) -> Path:
        """Each task's test predictions from its best seed (of the main table's runs), zipped."""
        spec = self.spec.submission
        return gather_submission(self.out, spec.archive, spec.files, results, self._table_run, log)

    def _table_run(self, name: str, seed: int) -> Run:
        """Task `name`'s run of `seed` that the main table reports: the deepest, first row, largest size."""
        return Run(name, seed, self.main_layers, row=self.rows[0], size=self.main_size)

    def _main_stats(self, name: str, metric: str, layers: int | None, row: str | None) -> dict[str, Any]:
        """The main metric of task `name` over the seeds, at `layers` transferred, of `row`."""
        runs = [Run(name, seed, layers, row=row, size=self.main_size) for seed in self.seeds]
        return seeds_stats({r.seed: self._result(r) for r in runs}, metric)
