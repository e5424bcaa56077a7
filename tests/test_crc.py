"""RINGDIST_CRC=1: a CRC32C trailer per transfer, verified before a receive completes."""
import pytest
import torch
import torch.distributed as dist

from harness.procs import field, launch

TRANSPORTS = ["tcp", "auto"]


def _checksummed_collectives(rank, ws):
    """Every data path once (ring, one-shot, receive-and-reduce, p2p with tags), exact values."""
    errors = []
    for n in [1, 7, 1001, (1 << 16) + 3]:
        for dtype in [torch.float32, torch.bfloat16, torch.int64]:
            t = torch.full((n,), rank + 1, dtype=dtype)
            dist.all_reduce(t)
            if not torch.all(t == ws * (ws + 1) // 2):
                errors.append(f"all_reduce {dtype} n={n}")
        out = torch.empty(ws * n)
        dist.all_gather_into_tensor(out, torch.full((n,), float(rank)))
        if not torch.equal(out, torch.arange(ws).repeat_interleave(n).float()):
            errors.append(f"all_gather n={n}")
        rs = torch.empty(n)
        dist.reduce_scatter_tensor(rs, torch.arange(ws).repeat_interleave(n).float() + rank)
        if not torch.all(rs == rank * ws + sum(range(ws))):
            errors.append(f"reduce_scatter n={n}")
        b = torch.full((n,), float(rank))
        dist.broadcast(b, src=ws - 1)
        if not torch.all(b == ws - 1):
            errors.append(f"broadcast n={n}")
    # Tags received in the other order than sent.
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    a, c = torch.full((5,), 10.0 * rank), torch.full((9,), 20.0 * rank)
    ra, rc = torch.empty(5), torch.empty(9)
    works = [dist.isend(a, nxt, tag=1), dist.isend(c, nxt, tag=2),
             dist.irecv(rc, prv, tag=2), dist.irecv(ra, prv, tag=1)]
    for w in works:
        w.wait()
    if not (torch.all(ra == 10.0 * prv) and torch.all(rc == 20.0 * prv)):
        errors.append("tagged send/recv")
    return errors


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("ws", [2, 3])
def test_collectives_correct_with_checksums(world_factory, ws, transport):
    env = {"RINGDIST_CRC": "1", "RINGDIST_SEGMENT_BYTES": "4096"}
    if transport == "tcp":
        env["RINGDIST_TRANSPORT"] = "tcp"
    results = world_factory(ws, env=env).run(_checksummed_collectives)
    assert results == [[]] * ws, results


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_flipped_checksum_fails_the_operation_naming_the_link(transport):
    # Every rank's 25th checksummed send carries a wrong CRC, as if a byte had flipped.
    results = launch(2, "until_error", env={"RINGDIST_CRC": "1", "RINGDIST_TRANSPORT": transport,
                                            "RINGDIST_TEST_CORRUPT_SEND": "25"}, timeout=120)
    for rank, (code, out, err) in enumerate(results):
        assert code == 0, f"rank {rank}:\n{out}\n{err}"
        message = field(out, "ERROR")
        assert message is not None, out
        assert "checksum mismatch" in message and f"rank {1 - rank}" in message, message


def test_without_checksums_the_fault_injection_is_inert():
    results = launch(2, "run", env={"RINGDIST_TEST_CORRUPT_SEND": "1"})
    for code, out, err in results:
        assert code == 0, err
        assert "DONE" in out


def test_ranks_must_agree_on_checksums():
    results = launch(2, "run", rank_env=[{"RINGDIST_CRC": "1"}, {"RINGDIST_CRC": "0"}], timeout=120)
    for rank, (code, out, err) in enumerate(results):
        assert code != 0, f"rank {rank} initialised although RINGDIST_CRC differs"
        assert "RINGDIST_CRC differs between ranks" in err, err[-2000:]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_result_hash_check_names_diverging_ranks(transport):
    # CRC off; rank 1 silently corrupts its 30th checked result. Every rank must fail that
    # operation with the ranks grouped by result hash.
    results = launch(3, "until_error", env={"RINGDIST_CHECK_RESULTS": "1",
                                            "RINGDIST_TRANSPORT": transport},
                     rank_env=[{}, {"RINGDIST_TEST_CORRUPT_RESULT": "30"}, {}], timeout=120)
    for rank, (code, out, err) in enumerate(results):
        assert code == 0, f"rank {rank}:\n{out}\n{err}"
        message = field(out, "ERROR")
        assert message is not None, out
        assert "results differ across ranks" in message, message
        assert "ranks 0 2 have" in message and "ranks 1 have" in message, message


def test_result_hash_check_passes_when_results_agree(world_factory):
    results = world_factory(3, env={"RINGDIST_CHECK_RESULTS": "1"}).run(_checksummed_collectives)
    assert results == [[]] * 3, results
