"""Stage profiles (Perseus CSV format), GPU clock candidate rules and frequency models."""

from envpipe.profile.band import OneClockBand, one_clock_band
from envpipe.profile.clockfit import ClockCurve, fit_curve, profile_clocks
from envpipe.profile.csv_profile import Profile, ProfileError, embedded_profile_path, load_profile
from envpipe.profile.freqmodel import FrequencyModel

__all__ = ["ClockCurve", "FrequencyModel", "OneClockBand", "Profile", "ProfileError", "embedded_profile_path",
           "fit_curve", "load_profile", "one_clock_band", "profile_clocks"]
