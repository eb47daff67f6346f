"""A worker on EC2 reacting to its Auto Scaling group's termination lifecycle action.

When the group terminates an instance (scale-in by someone else, a spot interruption, a
capacity rebalance), the termination lifecycle hook holds it in Terminating:Wait and the
instance metadata's ``autoscaling/target-lifecycle-state`` turns to ``Terminated``. The
watcher polls that (IMDSv2), asks the worker to drain (finish or hand back its jobs), and
once the worker has stopped, completes the lifecycle action with CONTINUE so the
termination goes ahead without waiting for the hook's heartbeat timeout.

Enabled when ``TIDE_INSTANCE_ID`` and ``TIDE_AWS_LIFECYCLE_HOOK`` are set (the Terraform
user data sets both, with ``TIDE_AWS_ASG_NAME``). Torch-free.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import httpx

from tide_fleet.infra.settings import Settings

log = logging.getLogger(__name__)

TOKEN_TTL_SECONDS = "300"


class LifecycleWatcher:
    def __init__(
        self,
        settings: Settings,
        on_terminate: Callable[[], None],
        autoscaling: Any = None,
        interval: float = 5.0,
    ) -> None:
        self.settings = settings
        self.on_terminate = on_terminate
        self.interval = interval
        self.triggered = threading.Event()
        self._stop = threading.Event()
        self._asg = autoscaling
        self._http = httpx.Client(base_url=settings.aws_imds_url, timeout=2.0)

    @staticmethod
    def enabled(settings: Settings) -> bool:
        return bool(settings.instance_id and settings.aws_lifecycle_hook)

    def target_state(self) -> str:
        """The instance's target lifecycle state from IMDSv2 ('InService', 'Terminated'...)."""
        token = self._http.put(
            "/latest/api/token",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": TOKEN_TTL_SECONDS},
        )
        token.raise_for_status()
        r = self._http.get(
            "/latest/meta-data/autoscaling/target-lifecycle-state",
            headers={"X-aws-ec2-metadata-token": token.text},
        )
        if r.status_code == 404:
            return ""  # not in an Auto Scaling group
        r.raise_for_status()
        return r.text.strip()

    def check(self) -> bool:
        """One poll; True (and the worker told to drain) once termination has begun."""
        if self.triggered.is_set():
            return True
        try:
            state = self.target_state()
        except httpx.HTTPError as e:
            log.debug("instance metadata unavailable: %s", e)
            return False
        if state == "Terminated":
            log.warning("instance %s is terminating: draining", self.settings.instance_id)
            self.triggered.set()
            self.on_terminate()
            return True
        return False

    def start(self) -> threading.Thread:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                if self.check():
                    return

        thread = threading.Thread(target=loop, name="lifecycle-watcher", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def complete(self) -> bool:
        """After the drain: let the termination proceed (only if it was ours to hold)."""
        if not self.triggered.is_set():
            return False
        if self._asg is None:
            import boto3

            self._asg = boto3.client("autoscaling", region_name=self.settings.aws_region)
        self._asg.complete_lifecycle_action(
            LifecycleHookName=self.settings.aws_lifecycle_hook,
            AutoScalingGroupName=self.settings.aws_asg_name,
            LifecycleActionResult="CONTINUE",
            InstanceId=self.settings.instance_id,
        )
        log.info("lifecycle action completed for %s", self.settings.instance_id)
        return True
