//! The monitoring HTTP endpoint (skeleton; being written).
