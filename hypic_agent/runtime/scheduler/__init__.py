"""The scheduler: one engine thread, a waiting queue, and a step loop that batches every running
request's decode with a bounded chunk of prepare work."""
