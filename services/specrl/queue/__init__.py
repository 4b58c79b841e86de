"""Redis streams between the orchestrator's admission, the generators and the trainer
(`streams`), and a Redis server specrl can start itself (`redis_server`)."""
