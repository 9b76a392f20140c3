//! HA heap.
