"""Launch an expert-parallel (EP) group of processes that load a ``deepep-bf16`` bake and run a layer's forward.

One process per rank: on CUDA, rank ``r`` uses ``cuda:r`` and the group is NCCL; on CPU the group
is gloo (CI runs the multi-rank logic this way, with the stand-in dispatcher). The group meets on
loopback (``tcp://127.0.0.1:<free port>``). Each rank loads only its experts
``[r * E/n, (r + 1) * E/n)`` of each job's layer from the bake, makes its decode-step inputs
(:func:`moebake.reference.moe_fp32.decode_inputs`, seeded per rank), and runs
dispatch -> masked expert GEMMs -> combine with DeepEP LL or the stand-in
(:func:`moebake.serve.deepep_bf16.make_dispatcher`). With a job's ``source``, each rank's output is
compared with an fp32 MoE over all experts computed from the source checkpoint.

Everything DeepEP LL or the bake cannot do is refused in the launching process, before any rank
starts, with one ``error:`` line (exit status 2 from the command line)::

    python -m moebake.serve.ep_launch BAKE --layer 0 --ranks 2 --tokens 64 [--source SRC]
        [--dispatcher auto|deepep|standin] [--backend deep_gemm|torch] [--device cuda|cpu]

:func:`run_ranks` is the generic part (any picklable ``fn(ctx, payload)`` on every rank), which the
layer benchmark uses as well.
"""

import argparse
import os
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from moebake.errors import MoebakeError, OptionError, PlatformError, UnsupportedError
from moebake.reference.moe_fp32 import decode_inputs, relative_l2, source_moe_fp32
from moebake.serve import deepep_ll
from moebake.serve.cuda_graph import capture
from moebake.serve.deepep_ll import LowLatencyBuffer, LowLatencyRefusal, LowLatencySpec

DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class RankContext:
    """What a rank's function gets: its rank, the group size, its device and the process group."""

    rank: int
    ranks: int
    device: torch.device
    group: Any


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_ranks(ranks: int, device: str) -> None:
    """MoebakeError unless ``ranks`` processes can run on ``device`` here (one GPU each on CUDA)."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise OptionError(f"ranks must be a positive integer, got {ranks!r}")
    if device not in DEVICES:
        raise OptionError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if ranks > gpus:
            raise PlatformError(f"{ranks} EP ranks need {ranks} GPUs (one process per GPU); this machine has {gpus}")


def _rank_main(rank: int, fn: Callable, ranks: int, device: str, port: int, out_dir: str, payload: Any) -> None:
    if device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks, device_id=torch.device("cuda", rank)
        )
        where = torch.device("cuda", rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks))
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
        where = torch.device("cpu")
    try:
        result = fn(RankContext(rank, ranks, where, dist.group.WORLD), payload)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable, ranks: int, device: str, payload: Any) -> list:
    """Run ``fn(RankContext, payload)`` in ``ranks`` new processes (one per GPU on ``cuda``; gloo on ``cpu``);
    returns each rank's return value, by rank. ``fn`` must be a module-level function; an exception
    in any rank is raised here (``torch.multiprocessing.ProcessRaisedException``)."""
    check_ranks(ranks, device)
    with tempfile.TemporaryDirectory(prefix="moebake-ep-") as out_dir:
        torch.multiprocessing.start_processes(
            _rank_main, args=(fn, ranks, device, free_port(), out_dir, payload), nprocs=ranks, join=True, start_method="spawn"
        )
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(ranks)]


@dataclass(frozen=True)
class LayerJob:
    """One forward: layer ``layer`` (index or prefix) of bake ``bake``, ``tokens_per_rank`` tokens on every rank.

    ``max_tokens_per_rank``: the dispatch buffer's size (default: ``tokens_per_rank``, rounded up);
    ``top_k``: default the bake's ``num_experts_per_tok``; ``drop``: some tokens select fewer than
    ``top_k`` experts; ``source``: the source checkpoint to compare against (fp32 MoE).
    """

    bake: str
    layer: int | str
    tokens_per_rank: int
    top_k: int | None = None
    max_tokens_per_rank: int | None = None
    seed: int = 0
    drop: bool = True
    source: str | None = None


@dataclass(frozen=True)
class LaunchConfig:
    """``ranks`` processes on ``device`` running ``jobs`` in order with dispatcher ``dispatcher``
    (``auto``, ``deepep``, ``standin``) and masked GEMM ``backend`` (None: DeepGEMM when usable). ``cuda_graph``:
    each job's forward is also captured in a CUDA graph and replayed on new inputs written into the captured
    input buffers; the replay must equal an eager forward on those inputs bit for bit (``graph_equal``)."""

    ranks: int
    jobs: tuple[LayerJob, ...]
    device: str = "cuda"
    dispatcher: str = "auto"
    backend: str | None = None
    keep_outputs: bool = False
    specs: tuple[LowLatencySpec, ...] = field(default=(), compare=False)
    cuda_graph: bool = False


def plan(config: LaunchConfig) -> LaunchConfig:
    """Check everything that can be checked before any rank starts; returns ``config`` with the
    dispatcher resolved (``auto`` -> ``deepep`` or ``standin``) and one spec per job.
    MoebakeError (LowLatencyRefusal for DeepEP's limits), one line, for anything wrong."""
    import moebake.serve
    from moebake.serve.deepep_bf16 import DISPATCHERS, DeepEPBf16Checkpoint

    if isinstance(config.ranks, bool) or not isinstance(config.ranks, int) or config.ranks < 1:
        raise OptionError(f"ranks must be a positive integer, got {config.ranks!r}")
    if config.dispatcher not in DISPATCHERS:
        raise OptionError(f"dispatcher must be one of {', '.join(DISPATCHERS)}, got {config.dispatcher!r}")
    if not config.jobs:
        raise OptionError("nothing to run: no jobs")
    specs = []
    for job in config.jobs:
        checkpoint = moebake.serve.open(job.bake)
        if not isinstance(checkpoint, DeepEPBf16Checkpoint):
            raise UnsupportedError(f"{job.bake}: target {checkpoint.target}; the EP launcher runs deepep-bf16 bakes")
        if isinstance(job.tokens_per_rank, bool) or not isinstance(job.tokens_per_rank, int) or job.tokens_per_rank < 1:
            raise OptionError(f"tokens per rank must be a positive integer, got {job.tokens_per_rank!r}")
        capacity = job.tokens_per_rank if job.max_tokens_per_rank is None else job.max_tokens_per_rank
        spec = checkpoint.low_latency_spec(job.layer, capacity, config.ranks, job.top_k)
        spec.check_batch(job.tokens_per_rank, spec.top_k)
        specs.append(spec)
    kind = config.dispatcher
    if kind == "auto":
        deep_ep_ok = config.device == "cuda" and deepep_ll.deep_ep_status()[0] is not None
        try:
            for spec in specs:
                spec.check(deep_ep=True)
        except LowLatencyRefusal:
            deep_ep_ok = False
        kind = "deepep" if deep_ep_ok else "standin"
    if kind == "deepep":
        for spec in specs:
            spec.check(deep_ep=True)
        if config.device != "cuda":
            raise PlatformError("the DeepEP dispatcher runs on CUDA only; use --device cuda or --dispatcher standin")
        module, why = deepep_ll.deep_ep_status()
        if module is None:
            raise PlatformError(f"DeepEP is not usable here ({why}); use --dispatcher standin")
    if config.cuda_graph and config.device != "cuda":
        raise PlatformError("--cuda-graph needs --device cuda")
    check_ranks(config.ranks, config.device)
    return replace(config, jobs=tuple(config.jobs), dispatcher=kind, specs=tuple(specs))


def layer_worker(ctx: RankContext, config: LaunchConfig) -> list[dict]:
    """One rank's part of :func:`launch`: every job's forward; results as documented there."""
    import moebake.serve
    from moebake.serve.deepep_bf16 import make_dispatcher

    buffer = LowLatencyBuffer(ctx.group, list(config.specs)) if config.dispatcher == "deepep" else None
    results = []
    try:
        for index, (job, spec) in enumerate(zip(config.jobs, config.specs)):
            checkpoint: Any = moebake.serve.open(job.bake)  # the target's runtime class, which loads experts
            prefix = checkpoint.layer(job.layer).prefix
            experts = checkpoint.load_experts(job.layer, ctx.device, ep_rank=ctx.rank, ep_size=ctx.ranks, backend=config.backend)
            dispatcher = make_dispatcher(spec, ctx.group, config.dispatcher, ctx.device, buffer)
            hidden, topk_ids, topk_weights = decode_inputs(
                job.tokens_per_rank,
                spec.hidden,
                spec.num_experts,
                spec.top_k,
                seed=job.seed * 1009 + ctx.rank,
                device=ctx.device,
                drop=job.drop,
            )
            out = experts.forward(hidden, topk_ids, topk_weights, dispatcher)
            result = {
                "job": index,
                "rank": ctx.rank,
                "ranks": ctx.ranks,
                "device": str(ctx.device),
                "prefix": prefix,
                "experts": (experts.first_expert, experts.first_expert + experts.num_local_experts),
                "tokens": job.tokens_per_rank,
                "max_tokens_per_rank": spec.max_tokens_per_rank,
                "top_k": spec.top_k,
                "hidden": spec.hidden,
                "num_experts": spec.num_experts,
                "dispatcher": dispatcher.name,
                "backend": experts.backend.name,
                "dropped_choices": int((topk_ids < 0).sum()),
            }
            if job.source is not None:
                reference = source_moe_fp32(job.source, prefix, hidden, topk_ids, topk_weights)
                result["rel_l2"] = relative_l2(out, reference)
            if config.keep_outputs:
                result["output"] = out.cpu()
            if config.cuda_graph:
                result["graph_equal"] = _graph_replay_equals_eager(experts, dispatcher, (hidden, topk_ids, topk_weights), spec, job, ctx)
            results.append(result)
            del experts, dispatcher, out
    finally:
        if buffer is not None:
            buffer.close()
    return results


def _graph_replay_equals_eager(experts: Any, dispatcher: Any, inputs: Any, spec: Any, job: LayerJob, ctx: RankContext) -> bool:
    """Capture ``experts.forward`` on static copies of ``inputs``, write the next seed's inputs into them, replay,
    and compare with an eager forward on those inputs (collective: every rank runs the same sequence)."""
    static = [t.clone() for t in inputs]
    graph, out = capture(lambda: experts.forward(*static, dispatcher))
    fresh = decode_inputs(
        job.tokens_per_rank,
        spec.hidden,
        spec.num_experts,
        spec.top_k,
        seed=(job.seed + 1) * 1009 + ctx.rank,
        device=ctx.device,
        drop=job.drop,
    )
    for target, value in zip(static, fresh):
        target.copy_(value)
    graph.replay()
    replayed = out.clone()
    expected = experts.forward(*fresh, dispatcher)
    torch.cuda.synchronize()
    return bool(torch.equal(replayed, expected))


def launch(config: LaunchConfig) -> list[list[dict]]:
    """Run ``config`` on ``config.ranks`` processes; ``results[rank][job]`` dicts with ``rank``, ``experts``
    (the rank's ``[start, stop)``), ``tokens``, ``dispatcher``, ``backend``, ``dropped_choices``,
    ``rel_l2`` (with a source) and ``output`` (CPU ``[T, H]`` BF16, with ``keep_outputs``)."""
    config = plan(config)
    return run_ranks(layer_worker, config.ranks, config.device, config)


def _layer_arg(value: str) -> int | str:
    return int(value) if value.isdigit() else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moebake.serve.ep_launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("bake", help="a deepep-bf16 output directory")
    parser.add_argument("--layer", type=_layer_arg, default=0, help="MoE layer index or tensor prefix (default 0)")
    parser.add_argument("--ranks", type=int, default=1, help="EP ranks = processes (one GPU each on cuda)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per rank")
    parser.add_argument("--max-tokens-per-rank", type=int, help="dispatch buffer size (default --tokens, rounded up)")
    parser.add_argument("--top-k", type=int, help="experts per token (default: the config's num_experts_per_tok)")
    parser.add_argument("--source", help="source checkpoint: compare each rank's output with an fp32 MoE over all experts")
    parser.add_argument("--tolerance", type=float, default=1e-2, help="largest relative L2 error accepted (with --source)")
    parser.add_argument("--dispatcher", default="auto", help="auto (DeepEP when usable), deepep or standin")
    parser.add_argument("--backend", help="masked GEMM: deep_gemm or torch (default: DeepGEMM when usable)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-drop", action="store_true", help="every token selects top-k experts (no -1 ids)")
    parser.add_argument(
        "--cuda-graph", action="store_true", help="also capture the forward in a CUDA graph, replay it on new inputs and compare with eager"
    )
    args = parser.parse_args(argv)
    job = LayerJob(args.bake, args.layer, args.tokens, args.top_k, args.max_tokens_per_rank, args.seed, not args.no_drop, args.source)
    config = LaunchConfig(args.ranks, (job,), args.device, args.dispatcher, args.backend, cuda_graph=args.cuda_graph)
    try:
        config = plan(config)
    except MoebakeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    worst, graph_failed = 0.0, False
    for (result,) in run_ranks(layer_worker, config.ranks, config.device, config):
        line = (
            f"rank {result['rank']}/{result['ranks']} on {result['device']}: experts [{result['experts'][0]}, "
            f"{result['experts'][1]}) of {result['num_experts']}, {result['tokens']} tokens x top-{result['top_k']} "
            f"({result['dropped_choices']} choices -1), dispatcher {result['dispatcher']}, GEMM {result['backend']}"
        )
        if "rel_l2" in result:
            worst = max(worst, result["rel_l2"])
            line += f", rel L2 vs fp32 source MoE {result['rel_l2']:.2e}"
        if "graph_equal" in result:
            line += f", CUDA graph replay {'equals' if result['graph_equal'] else 'DIFFERS FROM'} eager"
            graph_failed = graph_failed or not result["graph_equal"]
        print(line)
    if args.source is not None and worst >= args.tolerance:
        print(f"error: relative L2 {worst:.2e} >= tolerance {args.tolerance:g}", file=sys.stderr)
        return 1
    if graph_failed:
        print("error: a rank's CUDA graph replay differs from its eager forward on the same inputs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
