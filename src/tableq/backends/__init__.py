"""The SQL backends: one SqlBackend (sql.py) behind the Backend seam (base.py), and a package
per dialect (sqlite, postgres, mysql) with its driver, errors and named queries."""
