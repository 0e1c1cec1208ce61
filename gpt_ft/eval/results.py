"""A suite's results: per-seed scores aggregated (mean, sample std, the benchmark score) and
written as results.json, the results.md table and the results.png / transfer.png /
learning_curves.png charts."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpt_ft.data.layout import file_stamp, task_files
from gpt_ft.eval.suite_folder import write_atomic, write_json

if TYPE_CHECKING:
    from gpt_ft.adapters import TaskAdapter
    from gpt_ft.eval.suite_file import Score


def mean_std(values: list[float | None]) -> dict[str, float | None]:
    """Mean and sample standard deviation (n - 1) of the defined values (a correlation is
    undefined, None, when predictions are constant); None where there are too few for either."""
    values = [v for v in values if v is not None]
    mean = statistics.fmean(values) if values else None
    return {"mean": mean, "std": statistics.stdev(values) if len(values) > 1 else None}


def seeds_stats(results: dict[int, dict[str, Any] | None], metric: str) -> dict[str, Any]:
    """One metric over each seed's result (None: a run not finished): the finished seeds' values in
    percent (`percent`; None: undefined), as the main table keeps them, their mean and std."""
    values = {str(seed): percent(r["metrics"].get(metric), metric) for seed, r in results.items() if r}
    return {"seeds": values, **mean_std(list(values.values()))}


def with_seeds(stats: dict[str, Any] | None, seeds: list[int]) -> str:
    """A mean ± std, saying of how many of the seeds where fewer have a value (a run not finished,
    a constant guess's correlation)."""
    defined = sum(v is not None for v in ((stats or {}).get("seeds") or {}).values())
    return pm(stats) + (f" ({defined} of {len(seeds)} seeds)" if 0 < defined < len(seeds) else "")


def benchmark_score(score: Score, tasks: dict[str, Any]) -> dict[str, Any]:
    """The mean over the score's tasks of each task's mean over its metrics, each over the seeds
    that ran (fine-tuned). A correlation left undefined by constant predictions counts as 0, as
    GLUE's Matthews correlation does for them: a collapsed seed lowers the score, not leaves it.
    The zero-shot scores make a score of their own (`zero_shot`: each task's main metric, over the
    tasks scored so; a multiple-choice task's other zero-shot rules are not averaged in)."""
    per_task, zero, undefined = {}, {}, []
    for name in score.tasks:
        metrics = tasks.get(name, {}).get("metrics", {})
        means = []
        main = metrics.get(tasks.get(name, {}).get("main_metric"), {})
        if main.get("zero_shot") is not None:
            zero[name] = main["zero_shot"]
        for key, stats in metrics.items():
            if key.rpartition("/")[2] in RAW:
                continue
            if seeds := list((stats.get("seeds") or {}).values()):
                means.append(statistics.fmean(0.0 if v is None else v for v in seeds))
                if None in seeds and name not in undefined:
                    undefined.append(name)
        if means:
            per_task[name] = statistics.fmean(means)
    return {
        "name": score.name,
        "value": statistics.fmean(per_task.values()) if per_task else None,
        "tasks": per_task,
        "missing": [t for t in score.tasks if t not in per_task],
        "undefined": undefined,
        "zero_shot": statistics.fmean(zero.values()) if zero else None,
        "zero_shot_tasks": zero,
        "paper": score.paper,
    }


def write_results(out: Path, results: dict[str, Any]) -> None:
    """The report's files, each written whole or not at all (a failed write keeps the previous one)."""
    write_json(out / "results.json", results)
    write_atomic(out / "results.md", lambda tmp: tmp.write_text(results_markdown(results), encoding="utf-8"))
    if any(item["metrics"] for item in results["tasks"].values()):  # (a learning curve alone: none)
        write_atomic(out / "results.png", lambda tmp: plot_results(results, tmp))
    if any("transfer" in item for item in results["tasks"].values()):
        write_atomic(out / "transfer.png", lambda tmp: plot_transfer(results, tmp))
    if any(item.get("curves") for item in results["tasks"].values()):
        write_atomic(out / "learning_curves.png", lambda tmp: plot_curves(results["tasks"], tmp))


def results_markdown(results: dict[str, Any]) -> str:
    config = results["config"]
    seeds = config["seeds"]
    start = f"`{config['init_from']}`" if config["init_from"] else "scratch"
    scores = [stats for item in results["tasks"].values() for stats in item["metrics"].values()]
    fitted = config.get("fine_tune", True)  # (results of earlier versions: fine-tuned)
    if fitted and (any(stats.get("seeds") for stats in scores) or not any("zero_shot" in s for s in scores)):
        what = (
            f"Fine-tuned from {start}, {len(seeds)} seed(s) ({', '.join(map(str, seeds))}), scores in "
            f"percent on the validation splits (a margin as it is), the model at the {config['select']} "
            "epoch; mean ± sample std over seeds."
        )
    else:  # a zero-shot pass alone
        what = f"Zero-shot scores of {start}, not fine-tuned, in percent on the validation splits."
    quoted = (
        any("paper" in stats for stats in scores) or (results.get("score") or {}).get("paper") is not None
    )
    paper = " The GPT-1 paper's values are test-set scores (Radford et al., 2018)." * quoted
    lines = [f"# {results['suite']}", "", f"{what}{paper}", ""]
    if config.get("rows"):
        each = "; each row's main metric below" * any("by_row" in item for item in results["tasks"].values())
        lines += [f"Rows (each with its own fit arguments, in results.json): {', '.join(config['rows'])}; "
                  f"the table's scores are the first row's{each}.", ""]  # fmt: skip
    if any(item["metrics"] for item in results["tasks"].values()) or results.get("score") is not None:
        lines += ["| task | metric | fine-tuned | zero-shot | GPT-1 paper |", "|---|---|---|---|---|"]
    for name, item in results["tasks"].items():
        for key, stats in item["metrics"].items():
            zero, paper = _num(stats.get("zero_shot")), _num(stats.get("paper"))
            lines.append(f"| {name} | {key} | {with_seeds(stats, seeds)} | {zero} | {paper} |")
    score = results.get("score")
    if score is not None:
        covered, zero = len(score["tasks"]), score.get("zero_shot_tasks") or {}  # (none: earlier versions)
        of = covered + len(score["missing"])
        if covered or not zero:
            missing = f"; missing {', '.join(score['missing'])}" if score["missing"] else ""
            note = f" ({covered} of {of} tasks{missing}"
            if zero and len(zero) < of:  # the zero-shot value's own tasks
                note += f"; zero-shot {', '.join(zero)} alone"
        else:  # zero-shot alone: no task is missing from what ran
            note = f" (zero-shot, {len(zero)} of {of} tasks" + f": {', '.join(zero)}" * (len(zero) < of)
        if score.get("undefined"):
            note += f"; an undefined correlation counted as 0 in {', '.join(score['undefined'])}"
        note += ")"
        values = " | ".join(_num(score.get(key)) for key in ("value", "zero_shot", "paper"))
        lines.append(f"| **{score['name']}**{note} | mean | {values} |")
    sweeps = [("transfer", "Main metric by number of pretrained layers transferred (GPT-1 Fig. 2 left):",
               {str(k): f"{k} layers" for k in config.get("transfer_layers") or []}),
              ("by_row", "Main metric by row:", {row: row for row in config.get("rows") or {}})]  # fmt: skip
    for key, title, columns in sweeps:
        if by_task := {n: item[key] for n, item in results["tasks"].items() if key in item}:
            lines += [
                "",
                title,
                "",
                "| task | " + " | ".join(columns.values()) + " |",
                "|---|" + "---|" * len(columns),
            ]
            for name, stats in by_task.items():
                lines.append(
                    f"| {name} | " + " | ".join(with_seeds(stats.get(c), seeds) for c in columns) + " |"
                )
    lines += curves_markdown(results["tasks"], seeds)
    return "\n".join(lines) + "\n"


def bar_label(key: str, metrics: dict[str, Any]) -> str:
    """A metric's name on the chart: `accuracy`, or with its split where a task has several
    (MNLI's `validation_matched/accuracy` and `validation_mismatched/accuracy`)."""
    splits = {k.rpartition("/")[0] for k in metrics}
    split, _, metric = key.rpartition("/")
    return f"{split.removeprefix('validation_')} {metric}" if len(splits) > 1 else metric


def plot_results(results: dict[str, Any], path: Path) -> None:
    """Horizontal bars per task and metric: ours (mean ± std), zero-shot, and the paper's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        (f"{n} {bar_label(k, item['metrics'])}", s)
        for n, item in results["tasks"].items()
        for k, s in item["metrics"].items()
    ]
    series = [
        ("fine-tuned", "mean", "#1f77b4"),
        ("zero-shot", "zero_shot", "#2ca02c"),
        ("GPT-1 paper", "paper", "#aaaaaa"),
    ]
    series = [s for s in series if any(stats.get(s[1]) is not None for _, stats in rows)]
    height = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(7, 1 + 0.5 * len(rows) * max(1, len(series)) / 2))
    for j, (label, key, color) in enumerate(series):
        ys = [i + (j - (len(series) - 1) / 2) * height for i in range(len(rows))]
        values = [stats.get(key) or 0.0 for _, stats in rows]
        errors = [stats.get("std") or 0.0 for _, stats in rows] if key == "mean" else None
        ax.barh(ys, values, height=height, xerr=errors, color=color, label=label, capsize=2)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("score (%)")
    ax.set_title(results["suite"])
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_transfer(results: dict[str, Any], path: Path) -> None:
    """Main metric vs number of layers transferred, one line per task (GPT-1 Fig. 2 left)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, item in results["tasks"].items():
        if "transfer" not in item:
            continue
        ks = sorted(int(k) for k in item["transfer"])
        means = [item["transfer"][str(k)]["mean"] for k in ks]
        ax.plot(
            ks,
            [m if m is not None else math.nan for m in means],
            marker="o",
            label=f"{name} {item['main_metric']}",
        )
    ax.set_xlabel("pretrained layers transferred")
    ax.set_ylabel("score (%)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def curves_markdown(tasks: dict[str, Any], seeds: list[int]) -> list[str]:
    """The learning-curve table (one line per task and row) and each task's labels saved."""
    with_curves = {name: item for name, item in tasks.items() if item.get("curves")}
    if not with_curves:
        return []
    lines = ["", "Main metric by labelled training examples (learning curves; mean ± std over seeds):", ""]
    for name, item in with_curves.items():
        points = {size: point for row in item["curves"].values() for size, point in row.items()}
        sizes = sorted(points, key=lambda size: points[size]["examples"] or float("inf"))  # every row's
        lines += [f"| {name} | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
        for row, points in item["curves"].items():
            cells = [with_seeds(points.get(size), seeds) or "–" for size in sizes]
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
        saved = item.get("labels_saved")
        if saved:
            target = f"{saved['against']}'s {saved['target']:.1f} at {saved['target_examples']} examples"
            if saved["examples"] is None:
                lines += ["", f"{name}: {saved['row']} never reaches {target} in the sizes measured.", ""]
            else:  # (a second row measured on fewer sizes: the first may need more labels than it)
                ratio = saved["ratio"]
                labels = (
                    f"{ratio:.1f}× fewer"
                    if ratio > 1
                    else f"{1 / ratio:.1f}× more"
                    if ratio < 1
                    else "as many"
                )
                lines += ["", f"{name}: {saved['row']} reaches {target} with {saved['examples']} "
                          f"({labels} labels).", ""]  # fmt: skip
    return lines


def plot_curves(tasks: dict[str, Any], path: Path) -> None:
    """Score against labelled examples (log scale), one panel per task, one line per row with the
    seeds' spread (± std) as a band; a row named like TF-IDF is dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_curves = {name: item for name, item in tasks.items() if item.get("curves")}
    fig, axes = plt.subplots(1, len(with_curves), figsize=(4.5 * len(with_curves), 3.6), squeeze=False)
    for ax, (name, item) in zip(axes[0], with_curves.items()):
        for row, points in item["curves"].items():
            drawn = [(p["examples"], p["mean"], p["std"] or 0.0) for p in points.values()
                     if p["examples"] and p["mean"] is not None]  # fmt: skip
            if not drawn:  # no size scored yet (or a correlation undefined at every size)
                continue
            xs, ys, stds = zip(*drawn)
            style = "--" if "tf" in row.lower() else "-"
            ax.plot(xs, ys, style, marker="o", label=row)
            ax.fill_between(
                xs, [y - s for y, s in zip(ys, stds)], [y + s for y, s in zip(ys, stds)], alpha=0.2
            )
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel("labelled training examples")
        ax.set_ylabel(item["main_metric"].split("/")[-1] + " (%)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def input_stamps(task: TaskAdapter, data_dir: str | None, *paths: str | None) -> dict[str, str]:
    """What a result is computed from, as the files are now (`file_stamp`): the task's files under
    `data_dir` (its splits' and their labels'), and each of `paths` that is a local file, or the
    files of a local folder (a tokenizer, a transformers model). A rerun whose stamps differ
    computes the result again."""
    files = list(task_files(task, data_dir)) if data_dir and task.local else []
    for path in filter(None, paths):
        given = Path(path).expanduser()
        files += sorted(given.iterdir()) if given.is_dir() else [given]
    return {str(file): file_stamp(file) for file in files if file.is_file()}


def run_stamps(task: TaskAdapter, config: dict[str, Any]) -> dict[str, str]:
    """The stamps of the files a fit run reads (`input_stamps`): its task's data files, its
    tokenizer's and its weights', as its resolved configuration names them (a suite's options, its
    fit_args, a task's or a row's arguments alike)."""
    data = config["data"].get("init_args", config["data"])
    return input_stamps(task, data.get("data_dir"), data.get("tokenizer"), config["model"].get("init_from"))


def changed_files(before: dict[str, str] | None, now: dict[str, str]) -> list[str]:
    """'the file F' for each file whose stamp differs from the one a result recorded (none recorded:
    a result from before stamps were kept, taken as it is)."""
    if before is None:
        return []
    before, now = ({str(Path(f).resolve()): v for f, v in stamps.items()} for stamps in (before, now))
    return [f"the file {f}" for f in sorted(before.keys() | now.keys()) if before.get(f) != now.get(f)]


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def pm(stats: dict[str, Any] | None) -> str:
    """mean ± std (the std where several seeds have a value); empty where undefined."""
    if not stats or stats.get("mean") is None:
        return ""
    if stats.get("std") is not None:
        return f"{stats['mean']:.1f} ± {stats['std']:.1f}"
    return f"{stats['mean']:.1f}"


RAW = ("margin",)
"""Metrics that are no fraction (a preference's mean reward gap): reported as they are, not in
percent, and left out of a benchmark score."""


def percent(value: float | None, metric: str = "") -> float | None:
    """A metric's value in percent (`metric`'s name, e.g. validation/margin, among `RAW`: as it is)."""
    if value is None or not math.isfinite(value):
        return None
    return value if metric.rpartition("/")[2] in RAW else 100 * value


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"
