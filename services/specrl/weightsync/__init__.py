"""Weight sync: versioned, bucketed broadcast of policy and draft weights from their
publishers into live rollout servers (docs/weightsync.md)."""
