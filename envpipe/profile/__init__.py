"""Stage profiles (Perseus CSV format), GPU clock candidate rules and frequency models."""

from envpipe.profile.csv_profile import Profile, ProfileError, embedded_profile_path, load_profile
from envpipe.profile.freqmodel import FrequencyModel

__all__ = ["FrequencyModel", "Profile", "ProfileError", "embedded_profile_path", "load_profile"]
