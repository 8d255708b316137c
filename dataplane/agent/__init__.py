"""The node agent (``nimbus-agent``): the process cloud-init starts on every GPU VM.

It exchanges its one-time bootstrap token for a node credential, fetches model artifacts,
starts engine replicas (SGLang on GPUs, the simulator elsewhere) from one command template,
registers them once ``/health_generate`` passes, heartbeats their metrics, restarts crashed
engines with backoff and drains gracefully. See ``agent.py`` for the lifecycle.
"""
