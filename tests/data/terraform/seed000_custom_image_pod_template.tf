  runner_configuration = {
    job = {
      pod_template = jsonencode({
        spec = {
          containers = [
            {
              name            = "main"
              image           = "my-own-registry.com/platform-orchestrator/platform-orchestrator-runner:vx.y.z"
              imagePullPolicy = "IfNotPresent"
            }
          ]
          imagePullSecrets = [
            {
              name = "regcred"
            }
          ]
        }
      })
    }
  }
