"""Sim-to-sim transfer: replay a policy in C MuJoCo (and, for comparison, in our simulator) on the same clip, from
several start phases and seeds, and measure how well it tracks the reference (``docs/evaluation.md``).

The replay uses a non-differentiable :class:`~bcg.envs.G1TrackingVectorEnv` without domain randomisation or
observation noise, so the observations, the reference features, the action map (q_des = q_default + s_a tanh(a)) and
the termination are the training env's own code. Only the physics differs: for MuJoCo the env's replaceable
transition function (``env.transition_fn``) is a :class:`MujocoTransition`, which advances one float64 ``MjData`` per
environment through :class:`~bcg.evaluation.mujoco_loop.MujocoLoop` (same MJCF, MuJoCo's own contacts and joint
limits, 5 ms ``implicitfast``, the MJCF's position actuators with their kp / kv and torque limits, the same 4 substeps
per 50 Hz control step). The ``MjData`` stays the source of truth between steps: the env's float32 state is only
written back into it for a row the env itself reset. Leaving the transition function alone gives the same replay in
our simulator, which is how the penetration difference Δd is measured on the same policy, phases and seeds.

Protocol: E = phases x seeds episodes run side by side, without autoreset. Episode (seed s, phase k) starts at frame
floor(k (T - 1) / phases) of the T-frame clip in the reference pose and velocity (lifted so that no foot sphere is
below the floor), with uniform joint-angle noise of half-width ``joint_noise`` drawn from seed s, and runs until the
pelvis falls below the fall height (0.3 m), the state leaves the env's bounds (the instability guard: non-finite, or
a speed above ``bcg.sim.MAX_SPEED``), the clip ends or ``seconds`` have passed. A finished
episode is frozen (its physics is no longer advanced) and its later steps are not recorded.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from bcg.evaluation.mujoco_loop import MujocoLoop
from bcg.evaluation.tracking_metrics import ERROR_NAMES, TrackingMetrics, anchor_index, step_errors, summarize
from bcg.evaluation.transfer_protocol import TransferOptions, check_refine
from bcg.sim import ContactReport

if TYPE_CHECKING:  # pragma: no cover
    from bcg.envs import EnvState, G1TrackingVectorEnv
    from bcg.sim import Physics, SimModel

__all__ = ["MujocoTransition", "ReferenceReplayPolicy", "Rollout", "TransferOptions",
           "TransferReport", "evaluate_transfer", "make_env", "render_video", "replay", "start_state"]

Policy = Callable[[torch.Tensor], torch.Tensor]
"""``policy(obs [N, 849] float32) -> raw actions [N, 29]`` (the env applies tanh and the action map)."""

TERMINATION_DISTANCE = 1e3
"""Key-body distance [m] that ends a replay episode: effectively never, so that only falls (and unstable states) end one
early; a policy that drifts away from the reference keeps being measured."""


# ------------------------------------------------------------------------------------------------ transition fns


class MujocoTransition:
    """An env transition function (:class:`bcg.envs.TransitionFn`) that advances the rows in C MuJoCo.

    Holds one float64 ``MjData`` per environment of an ``num_envs``-row vector env. Every returned row carries a
    step token in its transition memory (``mujoco.token``, a serial number this function issued). A row is (re)set
    from the env's state when its token is not the one last issued for its environment (zero after a reset or a
    replaced state, an older one for a restored state, none at the first step) or when the env changed its velocity
    since (a push); otherwise MuJoCo continues from its own float64 state. A call may advance any subset of the
    environments, each at most once (the replay steps only the episodes still running); the others' ``MjData`` stay
    as they are.
    """

    def __init__(self, num_envs: int, substeps: int = 4, timestep: float = 0.005, refine: int = 1):
        self.refine = check_refine(refine, "refine")
        """MuJoCo steps of ``timestep / refine`` per substep of the env (1: MuJoCo steps at the env's substep)."""
        self.loop = MujocoLoop(num_envs, substeps=substeps * self.refine, timestep=timestep / self.refine)
        self.resets = 0
        """Rows set from the env's state so far."""
        self._tokens = torch.zeros(num_envs, dtype=torch.long)  # per environment, the token issued last (0: none)
        self._serial = 0
        self._last_qd = torch.zeros(num_envs, self.loop.model.nv)

    def __call__(self, model: SimModel, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor,
                 physics: Physics | None = None, *, env_ids: torch.Tensor,
                 memory: dict[str, torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, ContactReport, dict[str, torch.Tensor]]:
        loop = self.loop
        if physics is not None:
            raise ValueError("MujocoTransition simulates the MJCF's own parameters; per-environment physics rows "
                             "(domain randomisation) are not supported: make the env without it")
        if model.params.substeps * self.refine != loop.substeps or \
                not math.isclose(model.params.dt, loop.timestep * self.refine):
            raise ValueError(f"the env steps {model.params.substeps} x {model.params.dt} s per control step, this "
                             f"MuJoCo loop {loop.substeps} x {loop.timestep} s ({self.refine} per substep)")
        rows = env_ids.detach().cpu().numpy()
        if len(np.unique(rows)) != len(rows) or rows.min(initial=0) < 0 or rows.max(initial=0) >= loop.num_envs:
            raise ValueError(f"MujocoTransition advances each of its {loop.num_envs} environments at most once per "
                             f"step; got rows {rows.tolist()[:8]} (branched states need our simulator)")
        q, qd, targets = q.detach(), qd.detach(), targets.detach()
        token = (memory or {}).get("mujoco.token")
        token = torch.zeros(len(rows), dtype=torch.long) if token is None else token.detach().cpu()
        ours = self._tokens[rows]
        pushed = (qd.cpu() != self._last_qd[rows].to(qd.dtype)).any(1)
        stale = ((token == 0) | (token != ours) | pushed).numpy()
        if stale.any():
            loop.set_state(q[stale].cpu().double().numpy(), qd[stale].cpu().double().numpy(), rows[stale])
            self.resets += int(stale.sum())
        out = loop.step(targets.cpu().double().numpy(), rows)
        q1 = torch.as_tensor(out.qpos).to(q)
        qd1 = torch.as_tensor(out.qvel).to(qd)
        contact = ContactReport(*(torch.as_tensor(x, dtype=torch.float32, device=q.device)
                                  for x in (out.contact.impulse, out.contact.peak_force, out.contact.penetration)))
        # every row is now in step with its MjData (set above if it was not, then stepped)
        self._serial += 1
        self._tokens[rows] = self._serial
        self._last_qd[rows] = qd1.detach().cpu().to(self._last_qd.dtype)
        dev = q.device
        token_out = torch.full((len(rows),), self._serial, dtype=torch.long, device=dev)
        return q1, qd1, contact, {"mujoco.token": token_out}

    def qpos64(self) -> np.ndarray:
        """[N, nq] float64 positions of MuJoCo's state (the source of truth)."""
        return self.loop.qpos()


# ------------------------------------------------------------------------------------------------ policies


class ReferenceReplayPolicy:
    """The reference-replay baseline: the action whose PD target is the next reference frame's joint angles,
    ``env.target_to_action(motion.qpos[frame + 1, 7:])``. It reads the env's frame, so it is bound to an env with
    :meth:`bind` (``replay`` does that for any policy that has a ``bind`` method)."""

    def bind(self, env: G1TrackingVectorEnv) -> Policy:
        """The policy for ``env``: obs [N, D] -> raw actions [N, 29]."""
        qpos = env.motion.qpos.to(env.device, torch.float32)

        def policy(obs: torch.Tensor) -> torch.Tensor:
            nxt = (env.state.frame + 1).clamp(max=env.num_frames - 1)
            return env.target_to_action(qpos[nxt, 7:])

        return policy


# ------------------------------------------------------------------------------------------------ replay


def make_env(motion: Any, num_envs: int, *, simulator: Literal["mujoco", "bcg"], seconds: float | None = None,
             mujoco_refine: int = 1, **env_kwargs: Any) -> G1TrackingVectorEnv:
    """The replay env: no autoreset, no randomisation, no gradients, episodes end only at a fall, an unstable state, the
    clip's end or after ``seconds``; ``simulator="mujoco"`` puts a :class:`MujocoTransition` behind it
    (``mujoco_refine`` MuJoCo steps per substep), ``"bcg"`` keeps our simulator. ``env_kwargs`` go to the env
    (``dynamics``, ``action_scale``)."""
    from bcg.envs import G1TrackingVectorEnv

    if simulator not in ("mujoco", "bcg"):
        raise ValueError(f"simulator must be 'mujoco' or 'bcg', got {simulator!r}")
    env = G1TrackingVectorEnv(num_envs, motion, autoreset=False, differentiable=False, domain_randomization=False,
                              termination_distance=TERMINATION_DISTANCE, **env_kwargs)
    if seconds is not None:
        steps = max(1, int(round(seconds / env.control_dt)))
        env.max_episode_steps = steps
    p = env.model.params
    if simulator == "mujoco":
        env.transition_fn = MujocoTransition(num_envs, p.substeps, p.dt, refine=mujoco_refine)
    return env


def start_frames(num_frames: int, phases: int) -> np.ndarray:
    """[phases] start frames floor(k (T - 1) / phases), k = 0 .. phases - 1 (all in [0, T - 2])."""
    return np.minimum((np.arange(phases) * (num_frames - 1)) // phases, num_frames - 2)


def start_state(env: G1TrackingVectorEnv, frames: torch.Tensor, joint_noise: torch.Tensor | None = None) -> EnvState:
    """The env's state with every row at the reference pose and velocity of ``frames`` [N], plus ``joint_noise``
    [N, 29] [rad] on the hinges, lifted so that no foot sphere is below z = 0, at episode step 0, with the previous
    action set to the one that reproduces the reference pose (as the env's own reset)."""
    frames = torch.as_tensor(frames, dtype=torch.long, device=env.device)
    qpos = env.motion.qpos.to(env.device, torch.float32)[frames]
    qvel = env.motion.qvel.to(env.device, torch.float32)[frames]
    q = qpos.clone()
    if joint_noise is not None:
        q[:, 7:] += joint_noise.to(q)
    # lift: the lowest foot-sphere bottom to z = 0 if it is below (the env's reset rule)
    m = env.model
    kin = env.feature_fn.kin(q)
    body = torch.as_tensor(m.sphere_body, device=env.device)
    c = kin.pos[:, body] + (kin.rot[:, body] @ torch.as_tensor(m.sphere_pos).to(q)[None, :, :, None])[..., 0]
    low = (c[..., 2] - torch.as_tensor(m.sphere_radius).to(q)).amin(1)
    q[:, 2] += torch.clamp(-low, min=0.0)
    prev = env.target_to_action(qpos[:, 7:], torch.zeros_like(qpos[:, 7:]))
    s = env.state
    return dataclasses.replace(s, q=q, qd=qvel, frame=frames, episode_steps=torch.zeros_like(frames),
                               prev_actions=prev, delayed_actions=prev, memory={})


@dataclass(frozen=True)
class Rollout:
    """Recorded replay of E episodes over at most T control steps (step t = the state after control step t + 1)."""

    simulator: str
    """``"mujoco"`` or ``"bcg"``."""
    errors: dict[str, np.ndarray]
    """Per-step errors of :func:`bcg.evaluation.tracking_metrics.step_errors`, each [T, E]."""
    mask: np.ndarray
    """[T, E] bool: recorded steps (before and including each episode's last)."""
    penetration: np.ndarray
    """[T, E, 8] foot-sphere penetration at the end of each step [m]."""
    fell: np.ndarray
    """[E] bool: the episode ended with the pelvis below the fall height."""
    unstable: np.ndarray
    """[E] bool: the episode ended because its state left the env's bounds (``info["nonfinite"]``: non-finite, or a
    speed above ``bcg.sim.MAX_SPEED``)."""
    length: np.ndarray
    """[E] control steps each episode lasted."""
    start_frame: np.ndarray
    """[E] reference frame of each episode's start."""
    seed: np.ndarray
    """[E] the seed of each episode."""
    qpos: np.ndarray
    """[T + 1, E, nq] float64 robot positions from the start (MuJoCo's own float64 state for ``mujoco``); rows
    ``length[e] + 1`` on of episode ``e`` repeat where it ended (MuJoCo's last state, also an unstable one)."""
    frame: np.ndarray
    """[T + 1, E] reference frame of each recorded state."""
    control_dt: float
    """Control period [s]."""

    def metrics(self) -> TrackingMetrics:
        """:class:`TrackingMetrics` over all episodes."""
        return summarize(self.errors, self.mask, self.penetration, self.fell, self.control_dt, self.unstable)

    def episodes(self) -> list[dict[str, Any]]:
        """Per episode: seed, start frame, length [steps], end (``"fell"`` / ``"unstable"`` / ``"end"``) and its mean
        E_track [cm]."""
        e = self.errors["e_track_cm"]
        out = []
        for i in range(len(self.length)):
            end = "fell" if self.fell[i] else "unstable" if self.unstable[i] else "end"
            out.append({"seed": int(self.seed[i]), "start_frame": int(self.start_frame[i]),
                        "length": int(self.length[i]), "end": end,
                        "e_track_cm": float(e[self.mask[:, i], i].mean()) if self.length[i] else float("nan")})
        return out


def _bound_policy(policy: Any, env: G1TrackingVectorEnv) -> Policy:
    """The callable for ``env``; a policy that states its observation layout (an exported policy) must match."""
    layout = getattr(policy, "observation_layout", None)
    if layout is not None and [tuple(x) for x in layout] != [tuple(x) for x in env.observation_layout]:
        raise ValueError(f"the policy expects the observation layout {layout}, the env produces "
                         f"{env.observation_layout}")
    return policy.bind(env) if hasattr(policy, "bind") else policy


def replay(policy: Any, motion: Any, options: TransferOptions = TransferOptions(), *,
           simulator: Literal["mujoco", "bcg"] = "mujoco", progress: bool = False,
           env_kwargs: dict[str, Any] | None = None,
           transition_wrapper: Callable[[Any], Any] | None = None) -> Rollout:
    """Replay ``policy`` on ``motion`` (a packaged clip name, a path or a :class:`bcg.motion.Motion`) in one simulator.

    Args:
        policy: ``policy(obs [E, 849]) -> raw actions [E, 29]`` (torch), e.g. a loaded
            :class:`bcg.agents.export.ExportedPolicy`, or an object with ``bind(env) -> policy``
            (:class:`ReferenceReplayPolicy`).
        options: phases, seeds, episode length, initial noise (:class:`TransferOptions`).
        simulator: ``"mujoco"`` (C MuJoCo behind the env) or ``"bcg"`` (our simulator).
        progress: show a tqdm progress bar over the control steps.
        env_kwargs: further env options (``dynamics``, ``action_scale``); the fields set in ``options.dynamics``
            replace the same fields of ``env_kwargs["dynamics"]``.
        transition_wrapper: ``wrap(transition_fn) -> transition_fn`` put around the simulator's transition function,
            e.g. :class:`bcg.evaluation.sim_gap.RecordingTransition`; it is called with the rows of the episodes still
            running only (the replay steps the env's pure core, ``env.core``, on them; finished episodes stay where
            they ended).
    """
    # flat keywords: the env puts them into the dynamics it is given (EnvConfig.from_kwargs)
    kw = {**(env_kwargs or {}), **options.dynamics.chosen()}
    E, K = options.num_episodes, options.phases
    env = make_env(motion, E, simulator=simulator, seconds=options.seconds, mujoco_refine=options.mujoco_refine, **kw)
    if transition_wrapper is not None:
        env.transition_fn = transition_wrapper(env.transition_fn)
    env.reset(seed=0)  # shapes and keys; every row is then replaced by its start state
    T_clip = env.num_frames
    frames = np.tile(start_frames(T_clip, K), len(options.seeds))
    seeds = np.repeat(np.asarray(options.seeds, dtype=np.int64), K)
    noise = torch.zeros(E, env.model.nu)
    if options.joint_noise > 0:
        for j, s in enumerate(options.seeds):
            g = torch.Generator().manual_seed(int(s))
            noise[j * K:(j + 1) * K] = (2 * torch.rand(K, env.model.nu, generator=g) - 1) * options.joint_noise
    env.load_state(start_state(env, torch.as_tensor(frames), noise))
    act_fn = _bound_policy(policy, env)
    tfn = env.transition_fn
    anchor = anchor_index(env.model.body_names)
    longest = int(T_clip - 1 - frames.min())
    if env.max_episode_steps is not None:
        longest = min(longest, int(env.max_episode_steps))

    active = torch.ones(E, dtype=torch.bool)
    errs: dict[str, list[np.ndarray]] = {k: [] for k in ERROR_NAMES}
    masks, pens, qs, fr = [], [], [env.state.q.double().numpy().copy()], [env.state.frame.numpy().copy()]
    fell, unstable, length = np.zeros(E, bool), np.zeros(E, bool), np.zeros(E, np.int64)
    obs = env.observe()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=longest, desc=f"replay in {simulator}", unit="step", leave=False)
    with torch.no_grad():
        for t in range(longest):
            actions = torch.as_tensor(act_fn(obs)).to(torch.float32)
            if tuple(actions.shape) != (E, env.model.nu):
                raise ValueError(f"the policy returned actions of shape {list(actions.shape)}, expected "
                                 f"[{E}, {env.model.nu}] for observations {list(obs.shape)}")
            if not torch.isfinite(actions[active]).all():
                raise ValueError(f"the policy returned non-finite actions at step {t}")
            # the pure step of the episodes still running; finished ones stay where they ended (no autoreset)
            rows = active.nonzero().flatten()
            r = env.core(env.state[rows], actions[rows], tracking=True)
            s = env.state.scatter(rows, r.state)
            env.load_state(s)
            obs = obs.index_put((rows,), r.observation(env.observer))
            e = step_errors(env.features(s), env.ref_features(s.frame), anchor)
            for k in ERROR_NAMES:
                errs[k].append(e[k].numpy())
            masks.append(active.numpy().copy())
            pens.append(torch.zeros(E, r.contact.penetration.shape[1]).index_put((rows,), r.contact.penetration)
                        .numpy())
            qs.append(tfn.qpos64() if isinstance(tfn, MujocoTransition) else s.q.double().numpy())
            fr.append(s.frame.numpy().copy())
            ended = r.terminated | r.truncated
            fell[rows.numpy()] |= (r.fell & ended).numpy()
            unstable[rows.numpy()] |= (r.unstable & ended).numpy()
            length[active.numpy()] += 1
            active = active.index_put((rows,), ~ended)
            if bar is not None:
                bar.update(1)
            if not bool(active.any()):
                break
    if bar is not None:
        bar.close()
    env.close()
    return Rollout(simulator=simulator, errors={k: np.stack(v) for k, v in errs.items()}, mask=np.stack(masks),
                   penetration=np.stack(pens), fell=fell, unstable=unstable, length=length, start_frame=frames,
                   seed=seeds, qpos=np.stack(qs), frame=np.stack(fr), control_dt=float(env.control_dt))


# ------------------------------------------------------------------------------------------------ report


@dataclass(frozen=True)
class TransferReport:
    """Results of one transfer evaluation: metrics in MuJoCo and in our simulator, and Δd."""

    motion: str
    """Clip name."""
    policy: str
    """What was replayed (a file path, or ``reference``)."""
    options: TransferOptions
    """The protocol's options."""
    mujoco: TrackingMetrics
    """Metrics of the replay in C MuJoCo (the transfer result)."""
    bcg: TrackingMetrics
    """Metrics of the same replay in our simulator."""
    delta_d_mm: float
    """Δd = mean foot penetration in our simulator minus in MuJoCo [mm] (same policy, phases and seeds)."""
    episodes: dict[str, list[dict[str, Any]]]
    """Per simulator, per episode: seed, start frame, length, how it ended, mean E_track."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {"motion": self.motion, "policy": self.policy, "options": dataclasses.asdict(self.options),
                "mujoco": self.mujoco.to_dict(), "bcg": self.bcg.to_dict(), "delta_d_mm": self.delta_d_mm,
                "episodes": self.episodes}

    def to_json(self, indent: int | None = 2) -> str:
        """JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), indent=indent)

    def to_markdown(self) -> str:
        """A short Markdown report: the protocol, the metrics table of both simulators, Δd."""
        o = self.options
        length = "the clip's end" if o.seconds is None else f"{o.seconds:g} s"
        return "\n".join([
            f"# Transfer evaluation: {self.policy} on `{self.motion}`", "",
            f"{o.num_episodes} episodes ({o.phases} start phases x seeds {list(o.seeds)}, initial joint noise "
            f"+-{o.joint_noise:g} rad), each to a fall or {length}."
            + (f" MuJoCo takes {o.mujoco_refine} steps per substep." if o.mujoco_refine != 1 else ""), "",
            TrackingMetrics.markdown_table({"MuJoCo": self.mujoco, "bcg": self.bcg}), "",
            f"Δd (mean foot penetration, bcg - MuJoCo) = {self.delta_d_mm:+.3f} mm", "",
        ])


def evaluate_transfer(policy: Any, motion: Any, options: TransferOptions = TransferOptions(), *,
                      label: str = "policy", progress: bool = False, env_kwargs: dict[str, Any] | None = None
                      ) -> tuple[TransferReport, Rollout]:
    """Replay ``policy`` in MuJoCo and in our simulator with the same options; returns the report and the MuJoCo
    rollout (for :func:`render_video`)."""
    mj = replay(policy, motion, options, simulator="mujoco", progress=progress, env_kwargs=env_kwargs)
    ours = replay(policy, motion, options, simulator="bcg", progress=progress, env_kwargs=env_kwargs)
    m_mj, m_ours = mj.metrics(), ours.metrics()
    name = Path(motion).stem if isinstance(motion, (str, Path)) else getattr(motion, "name", str(motion))
    report = TransferReport(motion=str(name), policy=label, options=options, mujoco=m_mj, bcg=m_ours,
                            delta_d_mm=m_ours.mean_penetration_mm - m_mj.mean_penetration_mm,
                            episodes={"mujoco": mj.episodes(), "bcg": ours.episodes()})
    return report, mj


# ------------------------------------------------------------------------------------------------ video


def render_video(rollout: Rollout, motion: Any, path: str | Path, *, episode: int = 0, fps: float | None = None,
                 width: int = 640, height: int = 480, progress: bool = False) -> Path:
    """Write an MP4 of one episode of ``rollout`` (MuJoCo offscreen, the robot beside its translucent reference
    ghost, camera following the pelvis) at the control rate; needs ``imageio`` and ``imageio-ffmpeg``.

    Raises :class:`bcg.envs.rendering.RenderingUnavailableError` when no OpenGL back end can make a context.
    """
    from bcg.envs.rendering import GhostRenderer
    from bcg.motion import Motion, load_motion

    if not 0 <= episode < len(rollout.length):
        raise ValueError(f"episode must lie in [0, {len(rollout.length)}), got {episode}")
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg  # noqa: F401 - the ffmpeg binary imageio's MP4 writer runs
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("writing a video needs imageio and imageio-ffmpeg: pip install imageio imageio-ffmpeg"
                          ) from exc
    m = motion if isinstance(motion, Motion) else load_motion(motion)
    ref_q = m.qpos.detach().cpu().double().numpy()
    n = int(rollout.length[episode]) + 1
    renderer = GhostRenderer(width, height)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames_iter = range(n)
    if progress:
        from tqdm import tqdm

        frames_iter = tqdm(frames_iter, desc="video", unit="frame", leave=False)
    try:
        with imageio.get_writer(path, fps=fps or 1.0 / rollout.control_dt, codec="libx264", macro_block_size=8) as w:
            for t in frames_iter:
                f = min(int(rollout.frame[t, episode]), len(ref_q) - 1)
                w.append_data(renderer.render(rollout.qpos[t, episode], ref_q[f]))
    finally:
        renderer.close()
    return path
