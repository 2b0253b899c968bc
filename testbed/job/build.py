"""A training job's iteration as a graph (``traffic.jobgraph``), pure: model, parallelism and
placement in, every rank's program of compute spans and communications out.

Ranks are placed as Megatron-LM orders them: tensor parallelism fastest (a server's GPUs, over
its scale-up domain), then data parallelism (the same GPU of successive servers: along a rail),
then pipeline stages (blocks of servers); expert-parallel groups are consecutive data-parallel
ranks. Each rank runs, for its stage, the 1F1B schedule (Narayanan et al., SC 2021): up to
``pp - stage - 1`` forward passes to fill the pipeline, then one forward and one backward in
turn, then the remaining backward passes. A micro-batch's pass through a layer is its attention
and its MLP, each followed by the tensor-parallel all-reduce (MoE: the expert MLP between an
all-to-all dispatch and combine); a stage receives its input from the previous stage and sends
its output to the next. Gradients are all-reduced across data-parallel ranks in buckets of
about ``bucket_bytes``, filled in backward order (last layer first, as PyTorch DDP does): a
bucket's all-reduce starts once the last micro-batch's backward pass has made all its
gradients, and overlaps the backward passes of earlier layers. The optimizer step waits for
every bucket.

``byte_scale`` divides every size and every compute span by one factor, so that the iteration
fits the emulation while the ratio of communication to compute holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from traffic.jobgraph import COMM, COMPUTE, Comm, JobGraph, Op, check, reduced

from ..base.errors import ConfigError
from .model import GpuModel, Model

COMPUTE_STREAM = "compute"


@dataclass(frozen=True)
class Parallelism:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1  # expert-parallel ranks, out of the data-parallel ones
    micro_batches: int = 1
    micro_batch_size: int = 1  # sequences per micro-batch
    bucket_bytes: int = 25 << 20  # PyTorch DDP's default bucket
    bytes_per_element: int = 2  # BF16
    dp_collective: str = "ring"
    chunks: int = 1  # pipelined pieces of each collective's blocks

    @property
    def ranks(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass(frozen=True)
class Placement:
    """Where rank r sits in the parallel dimensions (Megatron-LM's order: tp, dp, pp)."""
    par: Parallelism

    def coords(self, r: int) -> Tuple[int, int, int]:
        """(tp rank, dp rank, pp stage) of global rank ``r``."""
        p = self.par
        return r % p.tp, (r // p.tp) % p.dp, r // (p.tp * p.dp)

    def rank(self, t: int, d: int, s: int) -> int:
        p = self.par
        return t + p.tp * (d + p.dp * s)

    def tp_group(self, r: int) -> Tuple[int, ...]:
        _t, d, s = self.coords(r)
        return tuple(self.rank(t, d, s) for t in range(self.par.tp))

    def dp_group(self, r: int) -> Tuple[int, ...]:
        t, _d, s = self.coords(r)
        return tuple(self.rank(t, d, s) for d in range(self.par.dp))

    def ep_group(self, r: int) -> Tuple[int, ...]:
        t, d, s = self.coords(r)
        e = self.par.ep
        first = d // e * e
        return tuple(self.rank(t, first + k, s) for k in range(e))

    def stage_peer(self, r: int, step: int) -> int:
        t, d, s = self.coords(r)
        return self.rank(t, d, s + step)


def one_f_one_b(stages: int, stage: int, micro_batches: int) -> List[Tuple[str, int]]:
    """The passes of ``stage`` under 1F1B, in order: ("F" or "B", micro-batch)."""
    warm = min(stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warm)]
    for i in range(micro_batches - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in range(micro_batches - warm, micro_batches)]


def check_parallelism(model: Model, par: Parallelism, ranks: int) -> None:
    """Refuse a parallelism that does not fit the model or the fabric, naming the key."""
    where = "workload.job"
    if par.ranks != ranks:
        raise ConfigError(f"{where}: dp x tp x pp = {par.dp} x {par.tp} x {par.pp} = "
                          f"{par.ranks}, but the job has {ranks} GPUs")
    if model.layers % par.pp:
        raise ConfigError(f"{where}.pp: {par.pp} stages cannot split {model.layers} layers "
                          "evenly")
    if par.ep > 1:
        if not model.moe:
            raise ConfigError(f"{where}.ep: expert parallelism needs a MoE model "
                              f"({model.name} is dense)")
        if par.dp % par.ep or model.experts % par.ep:
            raise ConfigError(f"{where}.ep: {par.ep} must divide dp ({par.dp}) and the "
                              f"experts ({model.experts})")


class ProgramWriter:
    """One rank's program as it is written: ops in order, the last op of each stream."""

    def __init__(self):
        self.ops: List[Op] = []
        self.last: Dict[str, int] = {}
        self.made: Dict[str, int] = {}

    def add(self, kind: str, name: str, stream: str, needs=(), makes=(), ns: int = 0,
            comm: int = -1) -> int:
        i = len(self.ops)
        after = {self.made[v] for v in needs}
        if stream in self.last:
            after.add(self.last[stream])
        self.ops.append(Op(kind, name, stream, tuple(sorted(after)), ns, comm, tuple(needs),
                           tuple(makes)))
        self.last[stream] = i
        for v in makes:
            self.made[v] = i
        return i


class _Builder:
    def __init__(self, model: Model, par: Parallelism, gpu: GpuModel, byte_scale: float,
                 name: str):
        self.model, self.par, self.gpu, self.scale, self.name = model, par, gpu, byte_scale, name
        self.place = Placement(par)
        self.comms: List[Comm] = []
        self.comm_of: Dict[tuple, int] = {}  # (kind, group, label) -> comm index
        self.programs = [ProgramWriter() for _ in range(par.ranks)]
        tokens = par.micro_batch_size * model.seq_len
        self.tokens = tokens
        self.activation = self.bytes(tokens * model.hidden * par.bytes_per_element)

    def bytes(self, n: float) -> int:
        return max(1, int(n / self.scale))

    def ns(self, flops: float) -> int:
        return int(round(self.gpu.ns(flops) / self.scale))

    def comm(self, r: int, label: str, collective: str, group: Tuple[int, ...], size: int,
             kind: str, needs=(), makes=(), stream: Optional[str] = None) -> None:
        key = (kind, group, label)
        c = self.comm_of.get(key)
        if c is None:
            c = self.comm_of[key] = len(self.comms)
            self.comms.append(Comm(collective, group, max(size, len(group)), self.par.chunks,
                                   kind))
        self.programs[r].add(COMM, label, stream or kind, needs, makes, comm=c)

    def compute(self, r: int, label: str, flops: float, needs=(), makes=()) -> None:
        self.programs[r].add(COMPUTE, label, COMPUTE_STREAM, needs, makes,
                             ns=self.ns(flops / self.par.tp))

    # --- one layer --------------------------------------------------------------------------
    def _tp(self, r: int, label: str, x: str) -> str:
        """``x`` all-reduced across the tensor-parallel group (nothing to do without one)."""
        if self.par.tp == 1:
            return x
        self.comm(r, f"tp {label}", "ring", self.place.tp_group(r), self.activation, "tp",
                  needs=(x,), makes=(x + "'",))
        return x + "'"

    def _ep(self, r: int, label: str, x: str) -> str:
        """``x`` all-to-all'd across the expert-parallel group."""
        if self.par.ep == 1:
            return x
        size = self.bytes(self.tokens * self.model.top_k * self.model.hidden
                          * self.par.bytes_per_element / self.par.tp)
        self.comm(r, f"ep {label}", "all_to_all", self.place.ep_group(r), size, "ep",
                  needs=(x,), makes=(x + "'",))
        return x + "'"

    def forward(self, r: int, layer: int, mb: int, x: str) -> str:
        m, tag = self.model, f"L{layer} mb{mb}"
        self.compute(r, f"fwd attn {tag}", m.attention_flops(self.tokens), (x,), (f"fa {tag}",))
        x = self._tp(r, f"fwd attn {tag}", f"fa {tag}")
        if m.moe:
            x = self._ep(r, f"fwd dispatch {tag}", x)
        self.compute(r, f"fwd mlp {tag}", m.mlp_flops(self.tokens), (x,), (f"fm {tag}",))
        x = f"fm {tag}"
        if m.moe:
            x = self._ep(r, f"fwd combine {tag}", x)
        return self._tp(r, f"fwd mlp {tag}", x)

    def backward(self, r: int, layer: int, mb: int, g: str, last_mb: bool) -> str:
        m, tag = self.model, f"L{layer} mb{mb}"
        grads = (f"grad L{layer}",) if last_mb else ()
        if m.moe:
            g = self._ep(r, f"bwd combine {tag}", g)
        self.compute(r, f"bwd mlp {tag}", 2 * m.mlp_flops(self.tokens),
                     (g, f"fm {tag}"), (f"bm {tag}",))
        g = f"bm {tag}"
        if m.moe:
            g = self._ep(r, f"bwd dispatch {tag}", g)
        g = self._tp(r, f"bwd mlp {tag}", g)
        self.compute(r, f"bwd attn {tag}", 2 * m.attention_flops(self.tokens),
                     (g, f"fa {tag}"), (f"ba {tag}",) + grads)
        return self._tp(r, f"bwd attn {tag}", f"ba {tag}")

    # --- one rank ---------------------------------------------------------------------------
    def rank(self, r: int) -> None:
        par, m = self.par, self.model
        _t, _d, stage = self.place.coords(r)
        per_stage = m.layers // par.pp
        layers = range(stage * per_stage, (stage + 1) * per_stage)
        first, last = stage == 0, stage == par.pp - 1
        prog = self.programs[r]
        # the iteration's start: its compute phase and straggle draw add to this op
        prog.add(COMPUTE, "start", COMPUTE_STREAM, makes=("weights",))
        m_count = par.micro_batches
        buckets = self._buckets(list(reversed(layers)))
        for pas, mb in one_f_one_b(par.pp, stage, m_count):
            if pas == "F":
                x = "weights" if first else f"in mb{mb}"
                if not first:
                    self._p2p(r, f"act mb{mb}", -1, recv=True, makes=(x,), stream="pp recv fwd")
                for layer in layers:
                    x = self.forward(r, layer, mb, x)
                if last:  # the logits' forward and backward, and the loss's gradient
                    self.compute(r, f"logits mb{mb}", 3 * m.logits_flops(self.tokens), (x,),
                                 (f"gout mb{mb}",))
                else:
                    self._p2p(r, f"act mb{mb}", +1, needs=(x,), stream="pp send fwd")
            else:
                g = f"gout mb{mb}"
                if not last:
                    self._p2p(r, f"grad mb{mb}", +1, recv=True, makes=(g,),
                              stream="pp recv bwd")
                for layer in reversed(layers):
                    g = self.backward(r, layer, mb, g, mb == m_count - 1)
                    if mb == m_count - 1 and layer in buckets:
                        self._bucket(r, *buckets[layer])
                if not first:
                    self._p2p(r, f"grad mb{mb}", -1, needs=(g,), stream="pp send bwd")
        prog.add(COMPUTE, "optimizer step", COMPUTE_STREAM,
                 needs=tuple(f"reduced {b}" for b in range(len(buckets))) if par.dp > 1 else
                 tuple(f"grad L{layer}" for layer in layers))

    def _p2p(self, r: int, label: str, step: int, recv: bool = False, needs=(), makes=(),
             stream: str = "pp") -> None:
        """Send to the stage ``step`` away (or receive from it): one send_recv comm."""
        peer = self.place.stage_peer(r, step)
        group = (peer, r) if recv else (r, peer)
        self.comm(r, f"pp {label} {group[0]}>{group[1]}", "send_recv", group,
                  self.activation // self.par.tp, "pp", needs=needs, makes=makes, stream=stream)

    def _buckets(self, backward_layers: List[int]) -> Dict[int, Tuple[int, Tuple[int, ...]]]:
        """Layer that completes each bucket -> (bucket index, its layers), in backward
        order."""
        per_layer = self.model.layer_params() / self.par.tp * self.par.bytes_per_element
        if self.model.moe and self.par.ep > 1:  # a rank holds experts / ep of each layer's MLPs
            per_layer = (self.model.attention_params() + self.model.mlp_params()
                         * self.model.experts / self.par.ep) / self.par.tp \
                * self.par.bytes_per_element
        out, current = {}, []
        for layer in backward_layers:
            current.append(layer)
            if len(current) * per_layer >= self.par.bucket_bytes or layer == backward_layers[-1]:
                out[layer] = (len(out), tuple(current))
                current = []
        self.bucket_bytes = {i: self.bytes(len(ls) * per_layer) for i, ls in out.values()}
        return out

    def _bucket(self, r: int, index: int, layers: Tuple[int, ...]) -> None:
        if self.par.dp == 1:
            return
        self.comm(r, f"dp bucket {index}", self.par.dp_collective, self.place.dp_group(r),
                  self.bucket_bytes[index], "dp",
                  needs=tuple(f"grad L{layer}" for layer in layers),
                  makes=(f"reduced {index}",))

    def graph(self) -> JobGraph:
        for r in range(self.par.ranks):
            self.rank(r)
        return JobGraph(tuple(tuple(p.ops) for p in self.programs), tuple(self.comms),
                        self.name)


def build(model: Model, par: Parallelism, gpu: GpuModel = GpuModel(), byte_scale: float = 1.0,
          name: str = "") -> JobGraph:
    """The job's iteration graph in modelled ns and bytes divided by ``byte_scale``: checked
    and with no dependency that others imply."""
    check_parallelism(model, par, par.ranks)
    graph = reduced(_Builder(model, par, gpu, byte_scale, name or model.name).graph())
    check(graph)
    return graph
