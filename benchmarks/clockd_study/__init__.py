"""The envpipe-clockd study: the daemon measured as a service, one module per benchmark;
`benchmarks/clockd_results.py` is their one command line.

- `fair`: fair service under abuse, 8 well-behaved clients beside `abuser` (raw JSON, rendered Markdown);
- `abuser`: an abusive client process, for `fair` and tests/clock/test_daemon_abuse.py;
- `faults`: lock latency with slow connections, resets after client and daemon deaths, a hung GPU;
- `latency`: lock-request round trips and the sustained rate of concurrent clients;
- `readonly`: the `readonly` backend on a real GPU machine;
- `harness` and `fake_pynvml`: daemon processes on the sim backend or on a fake pynvml (a driver call that hangs,
  clocks that outlive the daemon), and HTTP to them, for `faults` and the daemon's tests.
"""
