"""Several instances on one PostgreSQL database, and the PostgreSQL store and cluster fixture they rely on."""
