"""Collective schedules: results (symbolic replay), bytes moved, dependencies, factors."""
import pytest

from traffic import collectives as C

ALLREDUCE = ["ring", "halving_doubling", "double_binary_tree", "hierarchical"]


def _build(name, n, size, chunks=1, group=1):
    return C.build(name, n, size, chunks=chunks, group=group)


@pytest.mark.parametrize("name,n,group", [
    ("ring", 2, 1), ("ring", 5, 1), ("ring", 8, 1),
    ("halving_doubling", 2, 1), ("halving_doubling", 4, 1), ("halving_doubling", 8, 1),
    ("double_binary_tree", 2, 1), ("double_binary_tree", 5, 1), ("double_binary_tree", 8, 1),
    ("double_binary_tree", 14, 1),
    ("hierarchical", 8, 2), ("hierarchical", 6, 3), ("hierarchical", 4, 1), ("hierarchical", 4, 4),
    ("all_to_all", 2, 1), ("all_to_all", 5, 1), ("all_to_all", 8, 1)])
@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_rank_ends_with_the_right_data_in_any_order_the_dependencies_allow(
        name, n, group, chunks, seed):
    c = _build(name, n, n * 12 + 5, chunks, group)
    out = C.simulate(c, seed)
    for r in range(n):
        assert out[r] == C.expected_result(c, r), f"rank {r}"


def test_the_replay_catches_a_missing_dependency():
    c = C.ring(4, 48)
    broken = tuple(t if t.phase != "all-gather" else
                   C.Transfer(t.src, t.dst, t.tag, t.offset, t.dst_offset, t.nbytes, t.op, (),
                              t.phase) for t in c.transfers)
    bad = C.Collective(c.name, 4, 48, broken, c.kind)
    assert any(C.simulate(bad, s)[r] != C.expected_result(bad, r)
               for s in range(3) for r in range(4))


@pytest.mark.parametrize("name", ["ring", "halving_doubling", "hierarchical"])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_all_reduce_moves_2_n_minus_1_over_n_of_the_buffer_per_rank(name, n):
    size = 1 << 20
    c = _build(name, n, size, chunks=4, group=2 if n >= 4 else 1)
    for r in range(n):
        assert c.bytes_sent(r) == pytest.approx(2 * (n - 1) * size / n, abs=4 * n)
        assert c.bytes_received(r) == pytest.approx(2 * (n - 1) * size / n, abs=4 * n)


@pytest.mark.parametrize("name", ALLREDUCE)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_reduce_algorithms_move_2_n_minus_1_buffers_in_total(name, n):
    c = _build(name, n, 1 << 20, chunks=8, group=2 if n >= 4 else 1)
    assert c.total_bytes() == pytest.approx(2 * (n - 1) * (1 << 20), abs=8 * n * n)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_all_to_all_sends_s_over_n_to_every_other_rank(n):
    size = 1 << 20
    c = C.all_to_all(n, size)
    for r in range(n):
        sends = c.sends(r)
        assert sorted(t.dst for t in sends) == sorted(set(range(n)) - {r})
        assert {t.nbytes for t in sends} == {size // n}
        assert c.bytes_sent(r) == (n - 1) * (size // n)
        assert all(not t.after for t in sends)


@pytest.mark.parametrize("servers,per_server", [(4, 2), (2, 4), (3, 3)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pxn_all_to_all_keeps_the_fabric_on_rails_and_every_block_right(servers, per_server,
                                                                       seed):
    from traffic.jobgraph import pxn_places
    n = servers * per_server
    places = pxn_places(tuple(range(n)), per_server)
    c = C.all_to_all(n, n * 7, pxn=places)
    out = C.simulate(c, seed)
    assert all(C.result_ok(c, r, out[r]) for r in range(n))
    for t in c.transfers:  # between servers only along a rail; across rails only inside one
        (sa, ra), (sb, rb) = places[t.src], places[t.dst]
        assert sa == sb or ra == rb, t
    relayed = [t for t in c.transfers if t.phase == "pxn to rail"]
    assert len(relayed) == servers * (servers - 1) * per_server * (per_server - 1)
    assert c.scratch == len(relayed) * 7  # one staged block each, past the buffer


def test_pxn_s_forward_waits_for_the_block_it_relays():
    from traffic.jobgraph import pxn_places
    c = C.all_to_all(4, 28, pxn=pxn_places(tuple(range(4)), 2))
    broken = tuple(C.Transfer(t.src, t.dst, t.tag, t.offset, t.dst_offset, t.nbytes, t.op, (),
                              t.phase, t.source) for t in c.transfers)
    bad = C.Collective(c.name, 4, 28, broken, c.kind, c.scratch)
    assert any(not C.result_ok(bad, r, C.simulate(bad, s)[r])
               for s in range(4) for r in range(4))


def test_ring_sends_only_to_the_next_rank_in_2_n_minus_1_steps_and_pipelines_chunks():
    n, chunks = 6, 4
    c = C.ring(n, 6000, chunks=chunks)
    for r in range(n):
        sends = c.sends(r)
        assert {t.dst for t in sends} == {(r + 1) % n}
        assert len(sends) == 2 * (n - 1) * chunks
        assert [t.phase for t in sends].count("reduce-scatter") == (n - 1) * chunks
        # the first pieces of step 0 wait for nothing; every later piece waits for exactly one
        # piece from the predecessor: pipelining, not a barrier per step
        assert sum(1 for t in sends if not t.after) == chunks
        assert all(len(t.after) == 1 and t.after[0][0] == (r - 1) % n
                   for t in sends if t.after)


def test_halving_doubling_partners_and_halving_sizes():
    n, size = 8, 8 * 1024
    c = C.halving_doubling(n, size)
    sends = c.sends(5)
    assert [t.dst for t in sends] == [5 ^ 4, 5 ^ 2, 5 ^ 1, 5 ^ 1, 5 ^ 2, 5 ^ 4]
    assert [t.nbytes for t in sends] == [size // 2, size // 4, size // 8,
                                         size // 8, size // 4, size // 2]
    assert len(sends) == 2 * 3  # 2 log2 n steps


@pytest.mark.parametrize("n", [3, 6, 12])
def test_halving_doubling_refuses_non_powers_of_two_clearly(n):
    with pytest.raises(C.ScheduleError, match="power-of-two"):
        C.halving_doubling(n, 1 << 20)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 13, 14, 16])
def test_double_binary_trees_are_trees_with_at_most_two_children(n):
    for parents in C.double_binary_trees(n):
        assert parents.count(-1) == 1
        root = parents.index(-1)
        for r in range(n):  # every rank reaches the root
            seen, x = set(), r
            while x != root:
                assert x not in seen
                seen.add(x)
                x = parents[x]
        kids = [parents.count(r) for r in range(n)]
        assert max(kids) <= 2


def test_nccl_binary_tree_shape_for_14_ranks():
    # NCCL's illustration (src/graph/trees.cc): 0-8, 8-4, 8-12, 4-2, 4-6, 12-10, 12-13, ...
    p = C.btree_parents(14)
    assert p[8] == 0 and p[4] == 8 and p[12] == 8 and p[13] == 12 and p[10] == 12
    assert [p[r] for r in (1, 3, 5, 7, 9, 11)] == [2, 2, 6, 6, 10, 10]


@pytest.mark.parametrize("n", [4, 8, 16])
def test_in_the_double_tree_every_rank_is_a_leaf_in_one_tree(n):
    first, second = C.double_binary_trees(n)
    for r in range(n):
        assert r not in first or r not in second


def test_double_binary_tree_splits_the_buffer_in_halves_and_pipelines():
    n, size, chunks = 8, 8000, 4
    c = C.double_binary_tree(n, size, chunks=chunks)
    for t in (0, 1):
        mine = [x for x in c.transfers if x.phase.startswith(f"tree{t}")]
        assert sum(x.nbytes for x in mine if "reduce" in x.phase) == (n - 1) * size // 2
        assert sum(x.nbytes for x in mine if "broadcast" in x.phase) == (n - 1) * size // 2
        assert len({x.offset for x in mine}) == chunks


def test_hierarchical_keeps_inter_leaf_traffic_on_rails():
    n, g = 8, 2  # 4 leaves of 2 GPUs: rank = leaf * 2 + local
    c = C.hierarchical(n, 1 << 20, chunks=2, group=g)
    for t in c.transfers:
        if t.src // g != t.dst // g:  # crosses leaves
            assert t.src % g == t.dst % g, t  # same local index: the same rail
            assert t.phase.startswith("rail")
        else:
            assert t.phase.startswith("intra")
    flat = C.ring(n, 1 << 20)
    cross = sum(t.nbytes for t in c.transfers if t.src // g != t.dst // g)
    flat_cross = sum(t.nbytes for t in flat.transfers if t.src // g != t.dst // g)
    assert cross < flat_cross


def test_hierarchical_needs_whole_groups():
    with pytest.raises(C.ScheduleError, match="whole groups"):
        C.hierarchical(6, 1 << 20, group=4)


def test_tags_are_unique_per_sender_and_dependencies_point_at_receives():
    for name in C.ALGORITHMS:
        c = _build(name, 2 if name == "send_recv" else 8, 1 << 16, chunks=2, group=2)
        refs = {t.ref: t for t in c.transfers}
        assert len(refs) == len(c.transfers)
        for t in c.transfers:
            for dep in t.after:
                assert refs[dep].dst == t.src, (name, t)


def test_unknown_collective_names_the_known_ones():
    with pytest.raises(C.ScheduleError, match="known: ring"):
        C.build("butterfly", 4, 1024)


def test_ring_allreduce_is_an_alias_of_ring():
    assert C.build("ring_allreduce", 4, 1024).name == "ring"


@pytest.mark.parametrize("n", [2, 8, 16, 64])
def test_busbw_factors_match_nccl_tests(n):
    # nccl-tests, its performance notes: allreduce 2(n-1)/n; allgather, reducescatter and
    # alltoall (n-1)/n; broadcast and reduce 1.
    assert C.bus_bandwidth_factor("allreduce", n) == 2 * (n - 1) / n
    for kind in ("allgather", "reducescatter", "alltoall"):
        assert C.bus_bandwidth_factor(kind, n) == (n - 1) / n
    assert C.bus_bandwidth_factor("broadcast", n) == 1.0
    assert C.bus_bandwidth_factor("allreduce", 8) == 1.75


@pytest.mark.parametrize("name,n", [("all_gather", 2), ("all_gather", 5), ("reduce_scatter", 3),
                                    ("reduce_scatter", 8), ("send_recv", 2)])
@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_gather_scatter_and_point_to_point_leave_the_right_data(name, n, chunks, seed):
    c = _build(name, n, n * 12 + 5, chunks)
    out = C.simulate(c, seed)
    for r in range(n):
        assert C.result_ok(c, r, out[r]), f"rank {r}"
    assert C.KINDS[name] == c.kind


def test_a_reduce_scatter_without_its_dependencies_is_caught():
    c = C.reduce_scatter(4, 48)
    broken = tuple(C.Transfer(t.src, t.dst, t.tag, t.offset, t.dst_offset, t.nbytes, t.op, (),
                              t.phase) for t in c.transfers)
    bad = C.Collective(c.name, 4, 48, broken, c.kind)
    assert any(not C.result_ok(bad, r, C.simulate(bad, s)[r]) for s in range(3) for r in range(4))


@pytest.mark.parametrize("name", ["all_gather", "reduce_scatter"])
def test_gather_and_scatter_move_n_minus_1_over_n_per_rank(name):
    n, size = 8, 1 << 20
    c = C.build(name, n, size, chunks=4)
    assert all(c.bytes_sent(r) == pytest.approx((n - 1) * size / n, abs=8) for r in range(n))
