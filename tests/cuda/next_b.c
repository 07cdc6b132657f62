/* For the RTLD_NEXT test: the definition after next_a's. */
int client_next_probe(void) { return 2; }
