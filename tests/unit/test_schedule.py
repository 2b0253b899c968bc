import pytest

from traffic.schedule import (bus_bandwidth_factor, bytes_sent_per_rank, chunk_sizes,
                              ring_allreduce)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_ring_has_2n_minus_2_steps_to_the_next_rank(n):
    for r in range(n):
        steps = ring_allreduce(r, n, 1 << 20)
        assert len(steps) == 2 * (n - 1)
        assert {s.send_to for s in steps} == {(r + 1) % n}
        assert {s.recv_from for s in steps} == {(r - 1) % n}
        assert [s.phase for s in steps] == ["reduce-scatter"] * (n - 1) + ["all-gather"] * (n - 1)


@pytest.mark.parametrize("n,size", [(8, 1 << 20), (3, 1000), (5, 12345), (2, 7)])
def test_each_rank_sends_2_n_minus_1_over_n_of_the_buffer(n, size):
    assert bytes_sent_per_rank(n, size) == pytest.approx(2 * (n - 1) * size / n, abs=2 * n)
    assert sum(chunk_sizes(size, n)) == size


def test_what_a_rank_receives_is_what_its_predecessor_sends_in_the_same_step():
    n = 6
    sched = {r: ring_allreduce(r, n, 6000) for r in range(n)}
    for r in range(n):
        prev = (r - 1) % n
        for mine, theirs in zip(sched[r], sched[prev]):
            assert mine.recv_chunk == theirs.send_chunk
            assert mine.recv_bytes == theirs.send_bytes


@pytest.mark.parametrize("n", [2, 4, 7, 8])
def test_simulated_ring_all_reduce_gives_every_rank_the_full_sum(n):
    # data[r][c] = set of ranks whose contribution chunk c of rank r holds
    data = [[{r} for _ in range(n)] for r in range(n)]
    sched = {r: ring_allreduce(r, n, n * 10) for r in range(n)}
    for k in range(2 * (n - 1)):
        sent = {r: set(data[r][sched[r][k].send_chunk]) for r in range(n)}
        for r in range(n):
            st = sched[r][k]
            incoming = sent[st.recv_from]
            if st.phase == "reduce-scatter":
                data[r][st.recv_chunk] |= incoming  # reduce
            else:
                data[r][st.recv_chunk] = set(incoming)  # copy the reduced chunk
    full = set(range(n))
    assert all(data[r][c] == full for r in range(n) for c in range(n))


def test_bad_arguments():
    with pytest.raises(ValueError):
        ring_allreduce(0, 1, 100)
    with pytest.raises(ValueError):
        ring_allreduce(4, 4, 100)
    with pytest.raises(ValueError):
        chunk_sizes(3, 8)


def test_busbw_factor_is_nccl_tests_all_reduce_factor():
    assert bus_bandwidth_factor("ring_allreduce", 8) == pytest.approx(1.75)
    assert bus_bandwidth_factor("ring_allreduce", 2) == pytest.approx(1.0)
