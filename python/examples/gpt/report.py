"""The capstone's CSVs, summary and figure; no torch here (the notebook uses it without torch).

Files, for a prefix such as h100_gpt_capstone:
    PREFIX_text.csv, PREFIX_recall.csv   one row per backend per step (STEP_COLUMNS)
    PREFIX_summary.csv                   one row per task and backend (SUMMARY_COLUMNS)
    PREFIX_summary.md                    the same as a Markdown table, with how it was run
    PREFIX.png                           the loss curves (plot())
"""
import csv
import math
import pathlib

STEP_COLUMNS = ["task", "backend", "step", "seq", "loss", "val_loss", "val_accuracy",
                "tokens_per_s", "device", "commit", "date"]
SUMMARY_COLUMNS = ["task", "backend", "steps", "final_loss", "final_loss_rel_sdpa",
                   "final_val_loss", "final_val_loss_rel_sdpa", "final_val_accuracy",
                   "tokens_per_s", "speed_rel_sdpa", "stopped", "device", "commit", "date"]
TASKS = ("text", "recall")
SMALL_LOSS = 0.05  # below it the summary compares losses by difference, not by ratio


def _fmt(x):
    if x is None:
        return ""
    if isinstance(x, float):  # 9 significant digits give an fp32 value back exactly
        return f"{x:.9g}"
    return str(x)


def write_csv(path, columns, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _fmt(row.get(c)) for c in columns})


def read_csv(path):
    """Rows with the numeric columns as float (int for step and seq, None where empty)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            if key in ("step", "seq", "steps"):
                row[key] = int(value) if value else None
            elif key not in ("task", "backend", "device", "commit", "date", "stopped"):
                row[key] = float(value) if value else None
    return rows


def summarize(task, runs, tail=0.1):
    """One summary row per backend of `runs` {backend: (rows, stopped)}: the final loss is the
    mean training loss of the last `tail` of the steps (the same batches for every backend),
    the speed the tokens over the time of the timed steps at the task's full sequence length."""
    out = []
    for backend, (rows, stopped) in runs.items():
        n = max(1, int(len(rows) * tail))
        full = max(r["seq"] for r in rows)
        timed = [r["tokens_per_s"] for r in rows if r["tokens_per_s"] and r["seq"] == full]
        evals = [r for r in rows if r["val_loss"] is not None]
        out.append(dict(task=task, backend=backend, steps=len(rows),
                        final_loss=sum(r["loss"] for r in rows[-n:]) / n,
                        final_val_loss=evals[-1]["val_loss"] if evals else None,
                        final_val_accuracy=evals[-1]["val_accuracy"] if evals else None,
                        # tokens / total time = the harmonic mean of the steps' rates
                        tokens_per_s=len(timed) / sum(1 / t for t in timed) if timed else None,
                        stopped=stopped or ""))
    base = next((r for r in out if r["backend"] == "sdpa"), None)
    for row in out:
        if base is None:
            continue
        for key, ref in (("final_loss", "final_loss"), ("final_val_loss", "final_val_loss")):
            if row[key] is not None and base[ref]:
                row[key + "_rel_sdpa"] = row[key] / base[ref] - 1
        if row["tokens_per_s"] and base["tokens_per_s"]:
            row["speed_rel_sdpa"] = row["tokens_per_s"] / base["tokens_per_s"]
    return out


def summary_markdown(summary, header_lines):
    lines = list(header_lines) + [""]
    lines += ["| task | backend | steps | final loss | vs sdpa | val loss | vs sdpa | val accuracy | "
              "tokens/s | × sdpa |", "|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|"]

    def pct(x):
        return "—" if x is None or x == "" else f"{100 * x:+.2f}%"

    def num(x, f):
        return "—" if x is None or x == "" else format(x, f)

    base = {r["task"]: r for r in summary if r["backend"] == "sdpa"}

    def versus(r, key):
        """The relative difference to sdpa's value; where sdpa's loss is below SMALL_LOSS (a task
        solved, its loss near zero), the absolute difference instead: there a ratio of two
        tiny numbers says nothing."""
        b = base.get(r["task"], {}).get(key)
        if b is not None and r.get(key) is not None and abs(b) < SMALL_LOSS:
            return f"Δ {r[key] - b:+.4f}"
        return pct(r.get(key + "_rel_sdpa"))

    for r in summary:
        lines.append(f"| {r['task']} | {r['backend']} | {r['steps']} | {num(r['final_loss'], '.4f')} | "
                     f"{versus(r, 'final_loss')} | {num(r['final_val_loss'], '.4f')} | "
                     f"{versus(r, 'final_val_loss')} | {num(r['final_val_accuracy'], '.3f')} | "
                     f"{num(r['tokens_per_s'], ',.0f')} | {num(r.get('speed_rel_sdpa'), '.2f')} |")
    return "\n".join(lines) + "\n"


def smoothed(values, alpha=0.05):
    """An exponential moving average (the training loss of one batch is noisy)."""
    out, avg = [], None
    for v in values:
        avg = v if avg is None else (1 - alpha) * avg + alpha * v
        out.append(avg)
    return out


def plot(step_rows, path=None, title=""):
    """The loss curves of every task and backend: per task, the smoothed training loss with the
    validation loss as markers, and the smoothed training loss over sdpa's (the curves overlap
    when that ratio stays near 1). Returns the figure; saves it when `path` is given."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in TASKS if any(r["task"] == t for r in step_rows)]
    fig, axes = plt.subplots(len(tasks), 2, figsize=(12, 4 * len(tasks)), squeeze=False)
    for row_axes, task in zip(axes, tasks):
        rows = [r for r in step_rows if r["task"] == task]
        backends = list(dict.fromkeys(r["backend"] for r in rows))
        curves = {}
        for b in backends:
            mine = [r for r in rows if r["backend"] == b]
            curves[b] = ([r["step"] for r in mine], smoothed([r["loss"] for r in mine]))
            line, = row_axes[0].plot(*curves[b], label=f"{b} (training, smoothed)", lw=1.2)
            ev = [r for r in mine if r["val_loss"] is not None]
            row_axes[0].plot([r["step"] for r in ev], [r["val_loss"] for r in ev], "o", ms=3,
                             color=line.get_color(), label=f"{b} (validation)")
        row_axes[0].set(title=f"{task}: loss", xlabel="step", ylabel="cross-entropy (nats)")
        if task == "recall":
            row_axes[0].axhline(math.log(64), color="grey", ls=":", lw=1, label="chance (ln 64)")
        row_axes[0].legend(fontsize=7)
        if "sdpa" in curves:
            base = dict(zip(*curves["sdpa"]))
            for b in backends:
                steps, loss = curves[b]
                row_axes[1].plot(steps, [v / base[s] for s, v in zip(steps, loss) if s in base],
                                 label=b, lw=1.2)
            row_axes[1].axhline(1.0, color="grey", lw=0.8)
            row_axes[1].ticklabel_format(axis="y", useOffset=False)
            row_axes[1].set(title=f"{task}: smoothed training loss / sdpa's", xlabel="step",
                            ylabel="ratio")
            row_axes[1].legend(fontsize=7)
        else:
            row_axes[1].set_axis_off()
            row_axes[1].text(0.5, 0.5, "no sdpa run to compare with", ha="center")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def find_results(folder, pattern="*_gpt_capstone"):
    """{prefix: {"text": path, "recall": path, "summary": path}} for the files in `folder`."""
    found = {}
    for path in sorted(pathlib.Path(folder).glob(pattern + "_*.csv")):
        prefix, kind = path.stem.rsplit("_", 1)
        found.setdefault(prefix, {})[kind] = path
    return found
