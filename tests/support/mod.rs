//! Helpers shared by the integration tests: starting servers on free ports and finding peers.
