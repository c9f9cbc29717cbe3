"""The start-up benchmark's report: the plot and the Markdown tables of a results JSON written by
``bench/startup_bench.py`` (``{"runs": [...], "limits": [...], "notes": [...]}``; its docstring says what each
run's fields are). Not a script: ``python bench/startup_bench.py plot|table RESULTS`` calls it.

A section (a table's part, a plot's column) is one model and layer count, and one run set: a file that keeps
several run sets of one model labels each run, and that set's limits and notes, with its ``session`` field (a
short text); runs without one are one section per model, with the limits and notes no labelled run claims.
"""

import json
from pathlib import Path

import benchkit

ROOT = benchkit.REPO
PATHS = ("stock", "presharded", "bake")
"""The ways a model is loaded, in the order every table and plot shows them."""


# ----------------------------------------------------------------------------------------------- plot
COLORS = {"stock": "tab:gray", "presharded": "tab:orange", "bake": "tab:blue"}


LAYOUT = ("model", "layers", "session", "nodes", "gpus_per_node", "ep", "cache")


def _readahead_groups(runs: list[dict]) -> list[list[dict]]:
    """The bake's runs of each layout (model, nodes, GPUs, EP, cache) that ran both with its (opt-in) read-ahead and
    without (``startup_bench.py all --readahead both``: off, on, on, off), in the order they ran."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        if r["path"] == "bake" and "readahead_enabled" in r:
            groups.setdefault(tuple(r.get(k) for k in LAYOUT), []).append(r)
    return [g for g in groups.values() if {r["readahead_enabled"] for r in g} == {True, False}]


def _split_readahead(runs: list[dict]) -> tuple[list[dict], list[dict], list[list[dict]]]:
    """``(shown, alternate, groups)``: the read-ahead comparison's groups (:func:`_readahead_groups`); of their runs,
    the ``alternate`` ones, which the other tables and the plot leave out (all but each group's first run without it;
    the read-ahead's own table shows them all); and the ``shown`` runs, all the others."""
    groups = _readahead_groups(runs)
    alternate = [r for g in groups for r in g if r is not next(o for o in g if not o["readahead_enabled"])]
    return [r for r in runs if not any(r is a for a in alternate)], alternate, groups


def _section(run: dict) -> tuple:
    """``(model, layers, session)`` of a run (``session`` None where the file does not label it)."""
    return run["model"], run["layers"], run.get("session")


def _sections(runs: list[dict]) -> list[tuple]:
    """Every run's :func:`_section`, by expert count, model, layers, then session: unlabelled first, then in the
    order the sessions ran (their first run's place in the file)."""
    experts = {(r["model"], r["layers"]): r["experts"] for r in runs}
    first: dict[tuple, int] = {}
    for place, run in enumerate(runs):
        first.setdefault(_section(run), place)
    return sorted(first, key=lambda s: (experts[s[:2]], s[0], s[1], s[2] is not None, first[s]))


def _section_title(section: tuple, experts: int, before_session: str = ", ") -> str:
    """A section's title: ``{model}-shaped, {layers} MoE layers of {experts} experts``, then its run set, if any, after
    ``before_session`` (a plot's title puts it on a line of its own)."""
    model, layers, session = section
    return f"{model}-shaped, {layers} MoE layers of {experts} experts" + (f"{before_session}{session}" if session else "")


def _claims(entry: dict, section: tuple, runs: list[dict]) -> bool:
    """Whether a limits or notes ``entry`` (``model``, ``layers``, maybe ``session``) belongs to ``section``: the same
    model and layers, and its run set, or, for the unlabelled section, a run set no run of the file has."""
    model, layers, session = section
    if (entry.get("model"), entry.get("layers")) != (model, layers):
        return False
    if session is not None:
        return entry.get("session") == session
    return entry.get("session") not in {r.get("session") for r in runs if r.get("session") is not None}


def _one_node(runs: list[dict]) -> list[dict]:
    """The runs on one node (every rank on one machine; older files have no ``nodes``)."""
    return [r for r in runs if r.get("nodes", 1) == 1 and r["path"] != "presharded-dump"]


def _multi_node(runs: list[dict]) -> list[dict]:
    return [r for r in runs if r.get("nodes", 1) > 1]


def _deployment_runs(runs: list[dict]) -> list[dict]:
    """The scale-out view's runs: every simulated multi-node run, and the cold one-node one-GPU runs beside them."""
    return [
        r
        for r in runs
        if r["path"] != "presharded-dump"
        and r["cache"] == "cold"
        and "node_seconds" in r
        and (r["nodes"] > 1 or r["gpus_per_node"] == r["ep"] == 1)
    ]


def _bars(ax, groups: list, pick, label) -> None:
    """Bars of each path's seconds per group (``pick(group)``: ``[run, ...]``, file order; a bar per path of its
    first run, as the tables' first row, and a dot for each run where a path ran more than once), the bake's limit
    as a tick and stock/bake above the bake's bar."""
    width = 0.8 / len(PATHS)
    for j, group in enumerate(groups):
        runs = pick(group)  # a group is drawn only where it has a run
        chosen = _repeats(runs)[0]
        each = {path: [r["seconds"] for r in runs if r["path"] == path] for path in chosen}
        centre = {path: j + (k - (len(PATHS) - 1) / 2) * width for k, path in enumerate(PATHS)}
        for path in PATHS:
            if path in chosen:
                ax.bar(
                    centre[path],
                    chosen[path]["seconds"],
                    width * 0.95,
                    color=COLORS[path],
                    label=path if path not in ax.get_legend_handles_labels()[1] else None,
                )
                if len(each[path]) > 1:
                    ax.plot([centre[path]] * len(each[path]), each[path], "k.", ms=5)
        if "bake" in chosen:
            ax.plot(
                [j - 0.4, j + 0.4], [chosen["bake"]["limit_seconds"]] * 2, "k--", lw=1, label="bake's physical limit" if j == 0 else None
            )
        if {"stock", "bake"} <= set(chosen):
            ratio = chosen["stock"]["seconds"] / chosen["bake"]["seconds"]
            top = max(*each["bake"], chosen["bake"]["limit_seconds"])  # above the bake's bar, its dots and its limit
            ax.annotate(f"{ratio:.1f}x", (centre["bake"], top), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    ax.set_xticks(range(len(groups)), [label(g) for g in groups])
    if groups:
        ax.margins(y=0.1)
        ax.legend(loc="best", fontsize=7, framealpha=0.7)
    else:
        ax.text(0.5, 0.5, "not measured", ha="center", transform=ax.transAxes)


def plot(results_path: Path, png: Path | None = None) -> Path:
    """Per model: seconds of each path per (ep, cache) on one node, and per simulated deployment (slowest node, cold);
    the bake's physical limit as a tick; stock/bake above the bake's bar."""
    plt = benchkit.pyplot()
    everything = json.loads(Path(results_path).read_text())["runs"]
    runs, alternate, readahead_groups = _split_readahead(everything)
    sections = _sections(runs)
    rows = (2 if _multi_node(runs) else 1) + (1 if alternate else 0)
    fig, axes = plt.subplots(rows, len(sections), figsize=(6.5 * len(sections), 4.5 * rows), squeeze=False)
    for col, section in enumerate(sections):
        model, layers, session = section
        mine = [r for r in runs if _section(r) == section]
        label = _section_title(section, mine[0]["experts"], "\n")
        single = _one_node(mine)
        groups = sorted({(r["ep"], r["cache"]) for r in single}, key=lambda g: (g[1], g[0]))
        ax = axes[0][col]
        _bars(ax, groups, lambda g: [r for r in single if (r["ep"], r["cache"]) == g], lambda g: f"EP {g[0]}\n{g[1]}")
        ax.set_ylabel("seconds to ready (lower is better)")
        ax.set_title(f"SGLang start-up, {label}: one node", fontsize=10 if session else None)
        if _multi_node(runs):
            multi = _deployment_runs(mine)
            deployments = sorted({(r["nodes"], r["gpus_per_node"]) for r in multi})
            ax = axes[1][col]
            _bars(
                ax,
                deployments,
                lambda d: [r for r in multi if (r["nodes"], r["gpus_per_node"]) == d],
                lambda d: f"{d[0]} node(s)\nx {d[1]} GPU",
            )
            ax.set_ylabel("seconds, slowest node (cold page cache)")
            ax.set_title(f"{model}-shaped: scale-out, each node cold")
        if alternate:
            _readahead_bars(axes[-1][col], [g for g in readahead_groups if _section(g[0]) == section])
    png = Path(png) if png else Path(results_path).with_suffix(".png")
    benchkit.save(fig, png, dpi=110)
    return png


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _layout(run: dict) -> str:
    """``nodes x GPUs`` of a run (one node of EP GPUs in files before simulated nodes)."""
    return f"{run.get('nodes', 1)} x {run.get('gpus_per_node', run['ep'])}"


def _readahead_bars(ax, groups: list[list[dict]]) -> None:
    """The bake's mean seconds with its read-ahead off and on per layout (each run a dot), the limit as a tick,
    off/on on top."""
    for j, group in enumerate(groups):
        means = {}
        for on in (False, True):
            seconds = [r["seconds"] for r in group if r["readahead_enabled"] is on]
            means[on] = _mean(seconds)
            x = j + (0.2 if on else -0.2)
            ax.bar(
                x,
                means[on],
                0.38,
                color="tab:green" if on else COLORS["bake"],
                label=(f"bake, read-ahead {'on' if on else 'off'} (mean; dots: each run)") if j == 0 else None,
            )
            ax.plot([x] * len(seconds), seconds, "k.", ms=5)
        ax.plot([j - 0.4, j + 0.4], [group[0]["limit_seconds"]] * 2, "k--", lw=1, label="physical limit" if j == 0 else None)
        ax.text(j, max(r["seconds"] for r in group) * 1.02, f"off/on {means[False] / means[True]:.2f}x", ha="center")
    ax.set_xticks(range(len(groups)), [f"{_layout(g[0])}\n{g[0]['cache']}" for g in groups])
    ax.set_ylabel("seconds (slowest node)")
    ax.set_title("the bake's read-ahead, off and on (one run, order off, on, on, off)")
    if not groups:
        ax.text(0.5, 0.5, "not measured", ha="center", transform=ax.transAxes)
        return
    ax.legend(loc="best", fontsize=7, framealpha=0.7)


# ---------------------------------------------------------------------------------------------- table
def _limits_line(limits: dict) -> str:
    """The machine's limits as measured in one run set, in words."""
    disk = f"disk {limits['disk_direct_gbps' if 'disk_direct_gbps' in limits else 'disk_gbps']:.2f} GB/s with O_DIRECT"
    if "disk_buffered_gbps" in limits:
        disk += f", {limits['disk_buffered_gbps']:.2f} GB/s buffered (cold page cache, kernel readahead)"
    else:
        disk += " (the only disk probe of that run set: it underestimates the disk, whose buffered reads are faster)"
    line = f"{disk}; page cache {limits['page_cache_gbps']:.1f} GB/s"
    if "page_cache_threads" in limits:
        line += f" ({limits['page_cache_threads']} threads, as one rank's reader)"
    for ranks, gbps in limits.get("page_cache_node_gbps", {}).items():
        line += f", {gbps:.1f} GB/s with {ranks} such ranks reading at once (the node's total)"
    if "h2d_pinned_gbps" in limits:
        line += f"; host-to-device {limits['h2d_pinned_gbps']:.1f} GB/s pinned, {limits['h2d_pageable_gbps']:.1f} GB/s pageable"
    for gpus, gbps in limits.get("h2d_pinned_node_gbps", {}).items():
        line += f", {gbps:.1f} GB/s pinned with {gpus} GPUs copying at once (their total)"
    if "reader_alone_gbps" in limits:
        line += (
            f"; not a limit, the plugin's reader alone (reads and copies to one GPU, outside the server) "
            f"{limits['reader_alone_gbps']:.1f} GB/s"
        )
    return line


def _each(chosen: dict, key: str, scale: float = 1.0, digits: int = 2) -> str:
    """``key`` of each path's run (stock / presharded / bake), ``-`` where a path did not run."""
    return " / ".join(f"{chosen[p][key] / scale:.{digits}f}" if p in chosen else "-" for p in PATHS)


def _ratio(chosen: dict, top: str, bottom: str) -> str:
    return f"{chosen[top]['seconds'] / chosen[bottom]['seconds']:.2f}x" if {top, bottom} <= set(chosen) else "-"


def _repeats(runs: list[dict]) -> list[dict]:
    """The runs of one group (an (EP, cache), or a deployment) as rows, each ``{path: run}``: the first run of each
    path, then the second of each path run twice, and so on, in file order (the one-node table's rows; the plot's
    bars are the first)."""
    by_path: dict[str, list[dict]] = {}
    for run in runs:
        by_path.setdefault(run["path"], []).append(run)
    return [{path: each[i] for path, each in by_path.items() if i < len(each)} for i in range(max(len(each) for each in by_path.values()))]


def _one_node_row(ep: int, cache: str, chosen: dict) -> str:
    seconds = " | ".join(f"{chosen[p]['seconds']:.2f}" if p in chosen else "-" for p in PATHS)
    limit = next(chosen[p]["limit_seconds"] for p in ("bake", "stock", "presharded") if p in chosen)
    over = f"{chosen['bake']['seconds'] / limit:.2f}" if "bake" in chosen else "-"
    return (
        f"| {ep} | {cache} | {seconds} | {_ratio(chosen, 'stock', 'bake')} | {_ratio(chosen, 'presharded', 'bake')} | "
        f"{limit:.2f} | {over} | {_each(chosen, 'bytes_read', 1e9)} | {_each(chosen, 'peak_gpu_extra_gib')} | "
        f"{_each(chosen, 'peak_host_rss_gib')} |"
    )


def _gb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e9:.2f}"


def _node_rows(runs: list[dict], stock_by_deployment: dict) -> list[str]:
    """One row per (deployment, path) of the simulated multi-node runs."""
    rows = []
    for r in sorted(runs, key=lambda r: (r["nodes"], PATHS.index(r["path"]))):
        stock = stock_by_deployment.get((r["nodes"], r["gpus_per_node"]))
        each = ", ".join(f"{s:.2f}" for s in r["node_seconds"])
        read = max(r["node_bytes_read"]) / 1e9
        speedup = f"{stock['seconds'] / r['seconds']:.2f}x" if stock else "-"
        rows.append(
            f"| {r['nodes']} x {r['gpus_per_node']} | {r['path']} | {r['seconds']:.2f} | {each} | {read:.2f} | "
            f"{_gb(r.get('node_bytes_needed'))} | {r['limit_seconds']:.2f} | {r['seconds'] / r['limit_seconds']:.2f} | "
            f"{speedup} | {r['peak_gpu_extra_gib']:.2f} |"
        )
    return rows


def _rss_split(runs: list[dict]) -> list[str]:
    """Where each run's host memory is (runs that recorded it): the process before the load, the peak, and the
    anonymous and file-backed (mmap'd shards) resident memory after it, GiB, largest rank."""
    split = [r for r in runs if "rss_before_load_gib" in r]
    if not split:
        return []
    lines = [
        "",
        "Host memory, GiB (largest rank): the process before its first byte (torch, CUDA context, SGLang's "
        "imports), its peak, and its anonymous and file-backed (mapped shard pages) resident memory after the load.",
        "",
        "| ep | cache | path | before load | peak RSS | anonymous after | file-backed after |",
        "|" + "---|" * 7,
    ]
    for r in sorted(split, key=lambda r: (r["cache"], r["ep"], PATHS.index(r["path"]))):
        lines.append(
            f"| {r['ep']} | {r['cache']} | {r['path']} | {r['rss_before_load_gib']:.2f} | "
            f"{r['peak_host_rss_gib']:.2f} | {r['rss_anon_after_gib']:.2f} | {r['rss_file_after_gib']:.2f} |"
        )
    return lines


def _phase(phases: dict, name: str, reads: str | None = None, first: str | None = None) -> str:
    """``phases[name]`` seconds (with ``phases[reads]``, the moebake reads inside it, in brackets, and where recorded
    the first read call's part of them: ``phases[first + "_ring"]``, its time on the reader's ring (of the ring's
    pinning, ``phases["pin_ring"]``, where recorded: the plugin begins it as the model is built), and
    ``phases[first + "_batches"][0]``, its seconds and bytes), ``-`` if absent."""
    if name not in phases:
        return "-"
    extra = ""
    if first and f"{first}_ring" in phases:
        extra += f"; ring {phases[f'{first}_ring']:.3f}"
        if "pin_ring" in phases:
            extra += f" of its {phases['pin_ring']:.3f} pinning"
    if first and phases.get(f"{first}_batches"):
        seconds, size = phases[f"{first}_batches"][0]
        extra += f"; first read {seconds:.3f} s, {size / 1e9:.2f} GB"
    inside = f" ({phases[reads]:.2f}{extra})" if reads in phases else ""
    return f"{phases[name]:.2f}{inside}"


def _phase_rows(runs: list[dict], repeats: list[dict] = ()) -> list[str]:
    """Where each run's seconds went (runs that recorded ``phases``: the slowest rank's); ``repeats``: the read-ahead
    comparison's repeated runs without it (:func:`_split_readahead`), labelled so."""
    timed = [r for r in runs if "phases" in r]
    if not timed:
        return []
    ahead = any("readahead" in r for r in timed)  # files from before the read-ahead keep their table as it was
    ringed = any("iterate_ring" in r["phases"] for r in timed)  # and files from before the ring's clock, theirs
    lines = [
        "",
        "Where the time goes, seconds (slowest rank, wall clock): the model's construction; the weight iteration "
        "with every loader it calls (in brackets: moebake's reads of the other tensors"
        + (
            "; of them, the "
            "time the read calls spent on its reader's pinned ring, pinning it or, where the pinning's own time "
            "follows, waiting for the pinning the plugin began as the model was built; and the first call's seconds "
            "and bytes"
            if ringed
            else ""
        )
        + "); every MoE layer's "
        "post-load step (in brackets: moebake's reads of the experts); the final CUDA synchronize; the rest "
        "(presharded: its reload but the build)"
        + (
            "; beside them, the bake's read-ahead: seconds from its first read to its last (in brackets: GB it read into the page cache)"
            if ahead
            else ""
        )
        + ".",
        "",
        "| nodes x GPUs | cache | path | total | build | iterate (moebake reads) | post-load (moebake reads) | sync "
        "| other |" + (" read-ahead (GB) |" if ahead else ""),
        "|" + "---|" * (10 if ahead else 9),
    ]
    for r in sorted(
        timed, key=lambda r: (r["cache"], r.get("nodes", 1), r["ep"], PATHS.index(r["path"]), bool(r.get("readahead_enabled")))
    ):
        p = r["phases"]
        layout = _layout(r)
        path = r["path"] + (", read-ahead" if r.get("readahead_enabled") else ", repeat" if any(r is x for x in repeats) else "")
        line = (
            f"| {layout} | {r['cache']} | {path} | {r['seconds']:.2f} | {_phase(p, 'build')} | "
            f"{_phase(p, 'iterate', 'iterate_reads', 'iterate')} | {_phase(p, 'post_load', 'post_load_reads')} | "
            f"{_phase(p, 'sync')} | {_phase(p, 'other')} |"
        )
        if ahead:
            read = r.get("readahead")
            line += f" {read['seconds']:.2f} ({read['bytes'] / 1e9:.2f}) |" if read else " - |"
        lines.append(line)
    return lines


def _each_seconds(runs: list[dict]) -> str:
    return ", ".join(f"{r['seconds']:.2f}" for r in runs)


def _readahead_rows(groups: list[list[dict]]) -> list[str]:
    """The bake with its read-ahead off and on, per layout: each run's seconds in the order they ran, the means' ratio,
    the limit, on/limit, and the most bytes one node read from the block device."""
    if not groups:
        return []
    lines = [
        "",
        "The bake's read-ahead (`moebake.loading.readahead`, opt-in), off and on in one run, in the "
        "order off, on, on, off: each run's seconds (slowest node, or slowest rank on one node), the ratio of the "
        "means, the limit and on/limit (the mean), and the most bytes one node read from the block device.",
        "",
        "| nodes x GPUs | cache | off s | on s | off/on (means) | limit s | on/limit | read per node GB off / on |",
        "|" + "---|" * 8,
    ]

    def read(run):
        return max(run["node_bytes_read"]) if "node_bytes_read" in run else run["bytes_read"]

    for g in sorted(groups, key=lambda g: (g[0]["cache"], g[0].get("nodes", 1), g[0]["ep"])):
        off, on = ([r for r in g if r["readahead_enabled"] is v] for v in (False, True))
        mean_off, mean_on = _mean([r["seconds"] for r in off]), _mean([r["seconds"] for r in on])
        limit = on[0]["limit_seconds"]
        lines.append(
            f"| {_layout(g[0])} | {g[0]['cache']} | "
            f"{_each_seconds(off)} | {_each_seconds(on)} | {mean_off / mean_on:.2f}x | {limit:.2f} | "
            f"{mean_on / limit:.2f} | {max(map(read, off)) / 1e9:.2f} / {max(map(read, on)) / 1e9:.2f} |"
        )
    return lines


def _dump_rows(dumps: list[dict]) -> list[str]:
    if not dumps:
        return []
    lines = [
        "",
        "SGLang's presharded dumps (its first-time load: every rank at once, then each rank's post-processed "
        "tensors written; valid for that EP/TP configuration only):",
        "",
        "| ep | stock load s | dump s | dump GB on disk |",
        "|---|---|---|---|",
    ]
    return lines + [f"| {d['ep']} | {d['load_seconds']:.2f} | {d['seconds']:.2f} | {d['dump_bytes'] / 1e9:.2f} |" for d in dumps]


ONE_NODE_HEADER = (
    "| ep | cache | stock s | presharded s | bake s | stock/bake | presharded/bake | limit s | bake/limit "
    "| read from disk GB stock / presharded / bake | peak GPU extra GiB stock / presharded / bake "
    "| peak host RSS GiB stock / presharded / bake |"
)
NODES_HEADER = (
    "| nodes x GPUs | path | slowest node s | each node s | read per node GB (largest) | bake's need per node GB "
    "| limit s | path/limit | stock/path | peak GPU extra GiB |"
)


def table(results_path: Path, md: Path | None = None, *, method: str) -> Path:
    """The Markdown summary of a results JSON (tables per model, the limits, the notes), beside it as ``.md``;
    ``method`` says what in the benchmark is SGLang's and what is not."""
    results_path = Path(results_path)
    results = json.loads(results_path.read_text())
    runs = results["runs"]
    shown = results_path.relative_to(ROOT) if results_path.is_relative_to(ROOT) else results_path
    lines = [
        f"# Whole-model start-up through SGLang: stock, presharded and a bake ({results_path.name})",
        "",
        f"Generated by `python bench/startup_bench.py table {shown}`"
        f" from the JSON beside it (do not edit by hand); plot: `{results_path.with_suffix('.png').name}`; "
        "script and method: `bench/startup_bench.py` (its docstring).",
        "",
    ]
    if "machine" in results:
        lines += [f"Machine: {results['machine']}; measured {results.get('date', '(no date)')}.", ""]
    lines += [
        "One node: seconds to ready (slowest rank; from building the model to the last layer's post-load step) "
        "of stock SGLang from the source, SGLang's presharded reload of its own dump, and the bake through "
        "moebake's plugin; the physical limit (the fastest the bake's bytes can reach the GPUs: cold, every "
        "rank's bytes through the one disk at the faster of the run's disk probes; warm, a rank's bytes out "
        "of the page cache, at its share of the node's where the run measured the node's ranks reading at "
        "once; never faster than pinned host-to-device copies); bytes read from the block device "
        "(all ranks); peak GPU memory beyond the parameters resident at the end (largest rank); peak host RSS "
        "(largest rank, mapped file pages included).",
        "",
    ]
    for section in _sections(runs):
        everything = [r for r in runs if _section(r) == section]
        mine, alternate, readahead_groups = _split_readahead(everything)
        lines += [f"## {_section_title(section, mine[0]['experts'])}", ""]
        for limits in results.get("limits", []):
            if _claims(limits, section, runs):
                session = f" ({limits['session']})" if "session" in limits else ""
                lines += [f"Limits measured with these runs{session}: {_limits_line(limits)}.", ""]
        single = _one_node(mine)
        groups = sorted({(r["ep"], r["cache"]) for r in single}, key=lambda g: (g[1], g[0]))
        if single:
            lines += [ONE_NODE_HEADER, "|" + "---|" * 12]
        else:
            lines += ["One node: no runs in this section."]
        for ep, cache in groups:
            lines += [_one_node_row(ep, cache, chosen) for chosen in _repeats([r for r in single if (r["ep"], r["cache"]) == (ep, cache)])]
        eps, caches = sorted({r["ep"] for r in single}), sorted({r["cache"] for r in single})
        missing = [f"EP {ep} {cache}" for ep in eps for cache in caches if (ep, cache) not in groups]
        if missing:
            lines += ["", f"Not measured: {', '.join(missing)}."]
        multi = _deployment_runs(mine)
        if _multi_node(mine):
            stock = {(r["nodes"], r["gpus_per_node"]): r for r in multi if r["path"] == "stock"}
            lines += [
                "",
                "Simulated nodes, cold: a deployment of N nodes x G GPUs (EP = N x G) measured one node at a "
                "time, the page cache dropped before each, the node's G ranks loading while the other nodes' "
                "ranks sit idle in the same world. Seconds of the slowest node and of each; bytes the node read "
                "from the block device; the bake's need (the other tensors once, and the node's ranks' experts); "
                "the limit (that need at the disk's speed).",
                "",
                NODES_HEADER,
                "|" + "---|" * 10,
            ]
            lines += _node_rows(multi, stock)
        lines += _dump_rows([r for r in mine if r["path"] == "presharded-dump"])
        lines += _rss_split(single)
        lines += _phase_rows(single + [r for r in multi if r not in single] + alternate, alternate)
        lines += _readahead_rows(readahead_groups)
        notes = sorted({r["note"] for r in everything if r.get("note")})
        notes += [n["text"] for n in results.get("notes", []) if _claims(n, section, runs)]
        lines += [""] + [f"Note: {n}" for n in notes] + ([""] if notes else [])
    lines += [
        "## What limits each number",
        "",
        "Cold: the disk. Every path reads the bytes it needs from it once; the bake reads more bytes than "
        "stock (its padding, SGLang's profile: H 2880 -> 3072, I 2880 -> 2944), so bake/limit near 1 means "
        "it runs at the disk's speed. A run that probed the disk with O_DIRECT only underestimates it "
        "(buffered reads with the kernel's readahead are faster on this machine), so its limit lies above "
        "the measured times (bake/limit below 1).",
        "",
        "Warm: the page cache and the host-to-device copies. The source's bytes are in memory; the limit is "
        "a rank's bytes at the page-cache probe's speed. A run whose limits name the probe's threads "
        "probed as a rank's reader reads (its threads and chunks, copying out of the page cache into buffers "
        "of their own, no device), and as the node's ranks read at once; an older probe read 4 "
        "files with a thread each, an estimate the loader beat (bake/limit below 1). The probe only reads: a "
        "loader must also copy each byte to the GPU, and the plugin's reader, reading and copying, reads at "
        "0.53-0.87x of the reads alone (bench/results/read_pipeline_h200.md, and the limits lines of "
        "startup_warm_h200x2.md and of startup_h200x2.md's 4 nodes of the 18-layer model); where a run "
        "measured it, the "
        "limits line gives the reader alone on the probe's files (not a limit). Where bake/limit is well "
        "above 1, the parts are in the table of where the time goes: the model's build with the pinning of "
        "the reader's ring, the other tensors, and each MoE layer's experts.",
        "",
        "Simulated nodes: each node reads from its own (here: the one) disk with an empty page cache. A real "
        "node has its own disk and its own page cache, so the nodes' times do not add up: a deployment is "
        "ready when its slowest node is.",
        "",
        "Presharded: SGLang's reload builds the model, runs the post-load step on the uninitialised "
        "parameters (with that step's GPU memory), then reads its rank's files whole into host memory and "
        "copies each tensor into its parameter. Its dump is made on the GPUs by a first-time load, and is "
        "valid for that EP/TP configuration only.",
        "",
        "Memory: peak GPU memory beyond the parameters is what a path needs on top of the loaded model "
        "(stock: the source's tensors, their padded copies and the interleaved results at once; the bake "
        "writes each rank's rows straight into the final parameters). Peak host RSS counts the mmap'd "
        "source pages stock reads through SGLang's iterator; the bake path reads through a bounded "
        "pinned ring.",
        "",
    ]
    lines += ["## What is SGLang's and what is not", "", " ".join(method.split()).replace("``", "`"), ""]
    md = Path(md) if md else results_path.with_suffix(".md")
    md.write_text("\n".join(lines).rstrip("\n") + "\n")
    return md
