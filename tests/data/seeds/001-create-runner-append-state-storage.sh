cat state-storage-config.yaml >> runner-config.yaml
