"""The private corpus and the release as files: work units, Parquet reading and validation, atomic releases, the dataset
card, the Dask cluster, the offline embedding model."""
