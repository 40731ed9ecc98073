"""Billing: what the fleet really costs, from the AWS Cost and Usage Report (CUR 2.0) and EC2 spot price history
(docs/billing.md). The tables are in `tables`; readers write them, the analysis prices hours from them."""
