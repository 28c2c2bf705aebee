import numpy as np
import pytest

from tasks.cluster import current_client, dask_client, map_shards


def _sum_with(shard, offset, big):
    return float(np.sum(shard) + offset + big.sum())


def test_map_shards_in_process_without_a_cluster():
    assert current_client() is None
    assert map_shards(_sum_with, [np.ones(3), np.ones(2)], 1.0, np.zeros(4)) == [4.0, 3.0]


@pytest.mark.slow
def test_map_shards_on_a_local_cluster_scatters_large_arguments():
    big = np.ones(200_000)  # 1.6 MB: scattered once, not shipped with every task
    shards = [np.full(5, i, dtype=float) for i in range(6)]
    with dask_client(n_workers=2) as client:
        assert current_client() is client
        assert len(client.scheduler_info()["workers"]) == 2
        results = map_shards(_sum_with, shards, 0.5, big)
    assert results == [5.0 * i + 0.5 + 200_000 for i in range(6)]
    assert current_client() is None
