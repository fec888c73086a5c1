# Completion of seed 000's ECS "custom container image" fragment (seed000_ecs_custom_image.tf, verbatim),
# which says "See other required properties in the ECS runner docs". The test places the fragment,
# unchanged, in a `locals` block of this module; this file gives it its serverless-ecs runner with those
# required properties: the role to assume, the job's region, cluster, subnets and execution role, and
# the state storage (s3: the only upstream storage type an ECS runner can use).
resource "platform-orchestrator_serverless_ecs_runner" "this" {
  id          = "my-ecs-runner"
  description = "ECS runner with a custom runner image"
  runner_configuration = {
    auth = {
      role_arn = "arn:aws:iam::123456789012:role/platform-orchestrator"
    }
    job = merge(local.runner_configuration.job, {
      region             = "eu-central-1"
      cluster            = "my-ecs-cluster"
      subnets            = ["subnet-0123456789abcdef0"]
      execution_role_arn = "arn:aws:iam::123456789012:role/ecs-task-execution"
    })
  }
  state_storage_configuration = {
    type = "s3"
    s3_configuration = {
      bucket = "my-ecs-runner-state"
    }
  }
}

output "id" {
  value = platform-orchestrator_serverless_ecs_runner.this.id
}
