"""Shared DQN settings of the CartPole learning tests (imported by test modules, not collected).

``CARTPOLE_FAST``: SB3 rl-zoo / CleanRL-style CartPole DQN (lr 1e-3, batch 64, 256-256 MLP, short
epsilon decay to 0.02) with Polyak targets (tau 0.005), Double DQN and 3-step targets (the
DQNConfig defaults), 8 env steps per env per iteration and a replay ratio of 0.25; evaluated with
10 greedy episodes every 5k env steps, stopping at a return of 475. Each test adds its layout,
buffer, learning start and budget.
"""

CARTPOLE_FAST = dict(num_steps=8, replay_ratio=0.25, batch_size=64, learning_rate=1e-3, hidden_sizes=(256, 256),
                     target_update_period=None, tau=0.005, epsilon_end=0.02, epsilon_decay_fraction=0.125,
                     eval_episodes=10, eval_every_env_steps=5000, stop_at_return=475)
