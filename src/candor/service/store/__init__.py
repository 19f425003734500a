"""All SQL of the service (STYLE §1), in subpackages by concept, each with a small public face (its `__init__`).

Code outside `store/` imports only those faces; modules inside import each other's modules directly. The package
import graph is acyclic (tests/e2e/project/test_layering.py); each line below depends only on lines above it.

* `db/`: engines and transactions, connection budgets, asyncpg statements, the SQLite writer gate, the
  connection-level dialect branches (URLs, pools, connection setup, locks), unreachable-database wording.
* `schema/`: tables, the DDL-level dialect branches (types, clocks, triggers, constraint names), migrations.
* `wakeups/`: LISTEN/NOTIFY and local wake-ups.
* `workspaces/`: workspaces, principals, authentication and authority.
* `checkpoints/`: incremental checkpoint encoding and packed message rows.
* `outbox/`: outbox claims and settlement, backlog, subscriptions, checkpoint cleanup.
* `runs/`: claims, the fence and attempt start, leases, the derived current checkpoint, outbox staging.
* `reads/`: row views, keyset lists, added messages.
* `threads/`: threads, inbox entries, run starts and resumes, interrupts, children, streams.
* `attempts/`: an attempt's inputs, step commits, seals, landed commits and recovery.
"""
