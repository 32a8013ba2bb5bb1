//! Placeholder: replaced by the storage engine (issue 3).
