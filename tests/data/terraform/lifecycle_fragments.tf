# Not from the seeds: the root module of the lifecycle test places each completed seed fragment in a
# module of its own (modules/<fixture name>: the fragment in a `locals` block, and its completion file).
variable "certificate_authority_data" {
  type = string
}

variable "client_certificate_data" {
  type = string
}

variable "client_key_data" {
  type      = string
  sensitive = true
}

variable "ssh_host_public_key" {
  type = string
}

variable "ssh_private_key" {
  type      = string
  sensitive = true
}

module "seed000_custom_image_pod_template" {
  source = "./modules/seed000_custom_image_pod_template"
}

module "seed000_ecs_custom_image" {
  source = "./modules/seed000_ecs_custom_image"
}

module "seed001_secret_env_pod_template" {
  source                     = "./modules/seed001_secret_env_pod_template"
  certificate_authority_data = var.certificate_authority_data
  client_certificate_data    = var.client_certificate_data
  client_key_data            = var.client_key_data
}
