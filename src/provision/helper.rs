//! Running the user helper (skeleton; being written).
