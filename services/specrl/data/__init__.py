"""Data sources of the RL loop and their verifiable rewards: the built-in arithmetic task
(`task`), a user's files or Hugging Face datasets (`sources`), reward functions and
reference answers (`rewards`), and the check a run makes before it starts (`check`)."""
