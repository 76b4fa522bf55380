//! Unit tests of the queue rules.
