cat runner-config.yaml
