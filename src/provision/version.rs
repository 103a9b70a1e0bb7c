//! rpm-style version comparison (skeleton; being written).
