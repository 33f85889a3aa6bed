"""Records evaluation episodes as animated GIF or MP4 files and as TensorBoard animations.

Frames come from `Problem.render_frame`: an image observation, or the env's own render. Encoding is imageio's (GIF
through Pillow; MP4 through imageio-ffmpeg, `pip install fleetrl[video]`). TensorBoard
shows an image summary whose encoded image is an animated GIF as an animation, which is
how its own video summaries work.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping

import gymnasium as gym
import imageio.v3 as iio
import numpy as np
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter

from fleetrl.common.extras import MissingExtra
from fleetrl.problems.base import Problem


class EpisodeRecorder:
    def __init__(self, problem: Problem, directory: str, max_episodes: int, fps: float = 10.0,
                 video_format: str = "gif"):
        if video_format not in ("gif", "mp4"):
            raise ValueError(f"record_format must be gif or mp4, got {video_format!r}")
        self.problem = problem
        self.directory = directory
        self.max_episodes = max_episodes
        self.fps = fps
        self.format = video_format
        self._frames: dict[int, list[np.ndarray]] = {}
        self._clips: dict[int, np.ndarray] = {}
        self.saved: dict[int, str] = {}

    def on_frame(self, env_index: int, episode: int, observation: Mapping[str, np.ndarray], ended: bool,
                 env: gym.Env | None = None) -> None:
        if episode >= self.max_episodes:
            return
        frame = self.problem.render_frame(observation, env)
        if frame is None:
            raise ValueError(f"{type(self.problem).__name__} has nothing to record: its observations hold no image "
                             "and its env does not render rgb_array; make the env with render_mode='rgb_array' "
                             "or override Problem.render_frame")
        self._frames.setdefault(episode, []).append(np.asarray(frame, np.uint8))
        if ended:
            self._save(episode)

    def _save(self, episode: int) -> None:
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, f"episode_{episode:04d}.{self.format}")
        frames = np.stack(self._frames.pop(episode))
        if self.format == "gif":
            iio.imwrite(path, frames, extension=".gif", duration=1000 / self.fps, loop=0)
        else:
            try:
                iio.imwrite(path, frames, extension=".mp4", fps=self.fps, plugin="FFMPEG")
            except (ImportError, ValueError) as e:
                raise MissingExtra("writing MP4", "video", e) from None
        self.saved[episode] = path
        self._clips[episode] = frames

    def write_tensorboard(self, writer: SummaryWriter, step: int) -> None:
        """Each saved episode as an animated image summary `eval/episode_<n>`."""
        for episode, frames in sorted(self._clips.items()):
            buffer = io.BytesIO()
            iio.imwrite(buffer, frames, extension=".gif", duration=1000 / self.fps, loop=0)
            height, width = frames.shape[1:3]
            image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=buffer.getvalue())
            writer.file_writer.add_summary(Summary(value=[Summary.Value(tag=f"eval/episode_{episode:04d}",
                                                                        image=image)]), step)
        writer.flush()
