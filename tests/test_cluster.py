import numpy as np
import pytest

from privseed.tasks.data.cluster import check_cluster, current_client, dask_client, map_shards, spills_to_disk


def _sum_with(shard, offset, big):
    return float(np.sum(shard) + offset + big.sum())


def test_map_shards_in_process_without_a_cluster():
    assert current_client() is None
    assert map_shards(_sum_with, [np.ones(3), np.ones(2)], 1.0, np.zeros(4)) == [4.0, 3.0]
    seen = []
    assert map_shards(_sum_with, [np.ones(3), np.ones(2)], 1.0, np.zeros(4),
                      on_done=lambda i, r: seen.append((i, r))) == [4.0, 3.0]
    assert seen == [(0, 4.0), (1, 3.0)]


@pytest.mark.slow
def test_map_shards_on_a_local_cluster_scatters_large_arguments():
    big = np.ones(200_000)  # 1.6 MB: scattered once, not shipped with every task
    shards = [np.full(5, i, dtype=float) for i in range(6)]
    with dask_client(n_workers=2) as client:
        assert current_client() is client
        assert len(client.scheduler_info()["workers"]) == 2
        # private record batches stay in the workers' memory: no spill buffer, nothing written to their disks
        assert list(client.run(spills_to_disk).values()) == [False, False]
        # the same cluster as an external one: same packages, spilling off, so it passes check_cluster
        check_cluster(client, client.scheduler.address)
        results = map_shards(_sum_with, shards, 0.5, big)
        seen = {}
        assert map_shards(_sum_with, shards, 0.5, big, on_done=seen.__setitem__) == results
    assert results == [5.0 * i + 0.5 + 200_000 for i in range(6)]
    assert seen == dict(enumerate(results))  # every shard reported once, with its own index
    assert current_client() is None


def test_dask_log_level_defaults_to_warning_and_follows_the_environment(monkeypatch):
    import logging

    from privseed.tasks.data.cluster import DASK_LOG_LEVEL_ENV, dask_log_level
    from privseed.tasks.errors import ConfigError

    monkeypatch.delenv(DASK_LOG_LEVEL_ENV, raising=False)
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", logging.INFO)
    assert dask_log_level() == logging.WARNING
    monkeypatch.setattr(root, "level", logging.DEBUG)  # privseed -v: distributed keeps its own levels
    assert dask_log_level() is None
    monkeypatch.setenv(DASK_LOG_LEVEL_ENV, "info")
    assert dask_log_level() == logging.INFO
    monkeypatch.setenv(DASK_LOG_LEVEL_ENV, "chatty")
    with pytest.raises(ConfigError, match="PRIVSEED_DASK_LOG_LEVEL"):
        dask_log_level()


@pytest.mark.slow
def test_dask_client_keeps_distributed_quiet_unless_asked(caplog, monkeypatch):
    import logging

    from privseed.tasks.data.cluster import DASK_LOG_LEVEL_ENV

    def distributed_info_records():
        return [r for r in caplog.records if r.name.startswith("distributed") and r.levelno < logging.WARNING]

    before = logging.getLogger("distributed").level
    monkeypatch.delenv(DASK_LOG_LEVEL_ENV, raising=False)
    caplog.set_level(logging.INFO)
    with dask_client(n_workers=1) as client:
        assert client.submit(sum, [1, 2]).result() == 3
    assert distributed_info_records() == []  # no scheduler/nanny start-stop lines
    assert logging.getLogger("distributed").level == before

    monkeypatch.setenv(DASK_LOG_LEVEL_ENV, "INFO")
    with dask_client(n_workers=1) as client:
        assert client.submit(sum, [3, 4]).result() == 7
    names = {r.name for r in distributed_info_records()}
    assert "distributed.scheduler" in names
    assert logging.getLogger("distributed").level == before
