"""Labs for the tests and benches (not shipped): the network lab scenarios, the fault lab, test transfers and the
real QUIC endpoints built from source."""
