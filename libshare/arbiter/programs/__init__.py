"""Programs: SPIR-V reflection and admission, vetting compiles, loading and quotas."""
