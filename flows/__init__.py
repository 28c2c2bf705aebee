"""privseed Prefect flows: they only wire tasks together, in the order of the pipeline diagram."""
