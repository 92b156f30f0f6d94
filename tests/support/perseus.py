"""What Perseus measured beside its shipped profiles (envpipe/profile/data)."""

# Blocking power Perseus measured for each GPU (W).
IDLE_W = {"gpt3-175b+a100_sxm_bf16": 83.64, "bloom+a40_bf16": 70.38}
