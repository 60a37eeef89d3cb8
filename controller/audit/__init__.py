"""Audits of the metadata history: Parquet export (pyarrow), Spark jobs and the report.

Never imported by the daemon. Only ``jobs`` imports pyspark, and only ``sc audit report`` loads it.
"""
