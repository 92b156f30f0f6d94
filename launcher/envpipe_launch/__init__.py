"""envpipe-launch: start multi-node DeepSpeed jobs (local, ssh, kube, cml) from hostfile templates.

Importing this package never imports torch or deepspeed: jobs are started as subprocesses or pods.
"""

__version__ = "0.1.0"
