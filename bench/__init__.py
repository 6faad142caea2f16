"""ductwork's benchmarks (issue 7): throughput, limit precision, claim cost, expand, blocked keys.

    python -m bench                      # SQLite (a fresh temp file), every benchmark
    python -m bench --all --json out.json
    python -m bench --quick --only B1,B3 --database-url postgresql://localhost/ductwork_bench

See bench/__main__.py for the options and bench/RESULTS.md for the latest table.
"""
