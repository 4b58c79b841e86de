"""The orchestrator: the RL loop (`loop`), its generators (`generation`), data and
rewards, the services it starts or reaches (`system`), `specrl run` (`run`) and the
run report (`report`)."""
