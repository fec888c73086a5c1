  runner_configuration = {
    job = {
      # Custom container image name
      image = "my-own-registry.com/platform-orchestrator/platform-orchestrator-runner:vx.y.z"
      # See other required properties in the ECS runner docs
    }
  }
