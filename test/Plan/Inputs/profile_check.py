"""Compares two parax-plan --json results of one pinned plan: the roofline
profile's and megatron-2021's (parax-plan-profile.test)."""
import json
import sys

roof, meg = (json.load(open(p))["plans"][0] for p in sys.argv[1:3])
print("megatron-2021 step longer:", meg["step_time_s"] > 1.3 * roof["step_time_s"])
print("megatron-2021 dp exposed:", meg["time_s"]["dp_comm"] > 0)
print("roofline dp hidden:", roof["time_s"]["dp_comm"] == 0)
