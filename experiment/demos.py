"""Demonstrations for HER: a scripted pick-and-place controller, and the demo file it writes.

Mirrors openai/baselines `her/experiment/data_generation/fetch_data_generation.py`; the file's
format and its reader are in harness/files.py. Provides the demonstrations of Nair et al. (2018),
"Overcoming Exploration in Reinforcement Learning with Demonstrations", Sec. IV, which ddpg.py
replays next to the agent's own episodes and clones with the behaviour-cloning loss.

The controller sees only the observation and the goal, and moves through four phases:
    above    gripper open, move to a point HOVER above the object;
    descend  gripper open, move down until the gripper is at the object's centre;
    grasp    close the gripper for GRASP_STEPS steps without moving;
    carry    gripper closed, move the object to the goal and hold it there until the end;
and back to `above` if the object slips out while carrying. A failed episode (the object not at
the goal after the T-th action) is dropped and another run in its place: the cloning loss copies
every action of a demo, and without --q_filter nothing would discard a failed one's. The success
rate printed counts every episode run.

Run:  python -m experiment.demos --env FetchPickAndPlace-v4 --num_demo 100 --out demos/pick100.npz
Test: `python -m pytest -q tests/test_demos.py`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # run as a file too
from experiment import check_output, run_command  # first: Ctrl-C on import is one line

# isort: split
import numpy as np

from harness.cli import ArgumentParser
from harness.errors import SaveError, UsageError
from harness.files import save_demos
from harness.goal_env import describe_env, make_env
from harness.mpi_util import one_blas_thread
from replay import EPISODE_KEYS, empty_episodes

HOVER = 0.05  # m above the object's centre where the descent starts
TOLERANCE = 0.01  # m: close enough to the phase's target point to move on
GRASP_STEPS = 3  # steps with the gripper closing before lifting (it closes in about 2)
SLIP = 0.03  # m between gripper and object centre beyond which the object was lost
GAIN = 10.  # u = GAIN * error (m): 0.1 m or more is a full step, which moves the gripper 0.05 m
OPEN, CLOSE = 1., -1.  # gripper action


class PickAndPlaceController:
    """u = controller(o, g) for FetchPickAndPlace: (dim_o,), (3,) -> (4,) in [-1, 1]."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.phase, self.grasp_steps = "above", 0

    def __call__(self, o, g):
        grip, obj = o[0:3], o[3:6]  # gripper and object positions (m)
        # the next phase when this one's condition holds (several in one step, if so)
        if self.phase == "carry" and np.linalg.norm(obj - grip) > SLIP:
            self.phase = "above"  # the object slipped out: go and fetch it again
        if self.phase == "above" and np.linalg.norm(obj + [0., 0., HOVER] - grip) < TOLERANCE:
            self.phase = "descend"
        if self.phase == "descend" and np.linalg.norm(obj - grip) < TOLERANCE:
            self.phase, self.grasp_steps = "grasp", 0
        if self.phase == "grasp":
            self.grasp_steps += 1
            if self.grasp_steps > GRASP_STEPS:
                self.phase = "carry"
        # the phase's target and gripper; carry, then hold: move the gripper by the object's
        # remaining way to the goal
        target, gripper = {"above": (obj + [0., 0., HOVER], OPEN), "descend": (obj, OPEN),
                           "grasp": (grip, CLOSE), "carry": (grip + (g - obj), CLOSE)}[self.phase]
        # (dim_u,) = dx, dy, dz = clip(GAIN * (target - grip), -1, 1), gripper
        return np.append(np.clip(GAIN * (target - grip), -1., 1.), gripper).astype(np.float32)


def generate(env_id, num_demo, seed):
    """Run the controller until num_demo episodes succeeded (episode i resets with seed + i),
    at most 10 * num_demo. Returns ({key: (num_demo, T or T+1, dim)}, T, episodes run)."""
    env = make_env(env_id)
    T = int(env.spec.max_episode_steps)
    controller, kept, attempts = PickAndPlaceController(), [], 0
    try:
        while len(kept) < num_demo and attempts < 10 * num_demo:
            obs, _ = env.reset(seed=seed + attempts)
            attempts += 1
            dims = {"o": obs["observation"].size, "g": obs["desired_goal"].size, "u": 4}
            episode = empty_episodes(1, dims, T)  # {key: (1, T or T+1, dim)}
            o, ag, g, u = episode["o"], episode["ag"], episode["g"], episode["u"]
            success = episode["info_is_success"]  # (1, T, 1)
            controller.reset()
            o[0, 0], ag[0, 0] = obs["observation"], obs["achieved_goal"]
            for t in range(T):
                g[0, t] = obs["desired_goal"]
                u[0, t] = controller(obs["observation"], obs["desired_goal"])
                obs, _, _, _, info = env.step(u[0, t])
                o[0, t + 1], ag[0, t + 1] = obs["observation"], obs["achieved_goal"]
                success[0, t, 0] = info.get("is_success", 0.)
            # info['is_success'] after the T-th action, as rollout.RolloutWorker reads it; failed
            # episodes are dropped: see the module docstring
            if success[0, -1, 0]:
                kept.append(episode)
    finally:
        env.close()
    if len(kept) < num_demo:
        raise RuntimeError(f"the controller succeeded in only {len(kept)} of {attempts} "
                           f"episodes of {env_id}")
    return {key: np.concatenate([ep[key] for ep in kept]) for key in EPISODE_KEYS}, T, attempts


def main(argv=None):
    one_blas_thread()  # before any env process starts: they inherit it
    p = ArgumentParser(prog="demos.py", description=__doc__.splitlines()[0])
    p.add_argument("--env", default="FetchPickAndPlace-v4",
                   help="FetchPickAndPlace-v<n> (default v4): the controller's only task")
    p.add_argument("--num_demo", type=int, default=100, help="successful episodes to store")
    p.add_argument("--out", required=True, help="the .npz to write")
    p.add_argument("--force", action="store_true", help="write over --out if it exists")
    p.add_argument("--seed", type=int, default=0, help="episode i resets with seed + i")
    args = p.parse_args(argv)
    if not args.env.startswith("FetchPickAndPlace"):
        p.error(f"--env {args.env}: the scripted controller knows FetchPickAndPlace only")
    if args.num_demo < 1 or args.seed < 0:
        p.error(f"--num_demo {args.num_demo} --seed {args.seed}: give a --num_demo of 1 or more "
                "and a --seed of 0 or more")
    check_output(p, "--out", args.out, args.force, ".npz")
    try:
        describe_env(args.env).reward_fun.close()  # an unknown id: one line, close matches
        episodes, T, attempts = generate(args.env, args.num_demo, args.seed)
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        save_demos(args.out, episodes, args.env, T)
    except (SaveError, UsageError, RuntimeError, OSError) as e:
        # one line; a full disk (SaveError) exits 1, as train.py's, and leaves no half-written file
        print(f"demos.py: error: {e}", file=sys.stderr)
        return 1 if isinstance(e, SaveError) else 2
    print(f"{args.env}: controller success rate {args.num_demo / attempts:.3f} "
          f"({args.num_demo} of {attempts} episodes); wrote the {args.num_demo} successful "
          f"ones to {args.out}")
    return 0


if __name__ == "__main__":
    run_command(main, "demos.py")  # [MPI] none started here: no other rank
