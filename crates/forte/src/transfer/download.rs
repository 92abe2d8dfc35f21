//! The source of `forte pull`: objects read from the relay.
