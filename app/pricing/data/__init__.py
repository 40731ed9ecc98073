"""Shipped price data: the EC2 GPU instance catalog (ec2-gpu-instances.csv)."""
