"""Learning throughput (``bcg bench --learning``): each part of a SHAC / PPO iteration against the env's own window.

    python benchmarks/learning_throughput.py [--presets cpu-small paper] [--methods bptt bcg ppo] [--iterations 5]
"""

from bcg.evaluation.learning_throughput import main

if __name__ == "__main__":
    main()
