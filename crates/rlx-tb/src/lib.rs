//! Thunderbolt transport for RLX (`ThunderboltTransport`) and the symmetric one-sided heap served over its links will live here.
